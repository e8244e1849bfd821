"""The names and shapes of a set of Gaussians' parameters (pre-activation, as in 3DGS; see
`gsrecon.model.gaussians`), checked in one place for the model, its PLY files and the exporters."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from gsrecon.errors import InputError
from gsrecon.sh import MAX_SH_DEGREE, sh_degree_of

PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")


def check_params(params: Mapping[str, Tensor]) -> int:
    """Check that ``params`` holds the six Gaussian tensors with consistent shapes and an SH degree gsrecon renders
    (0 to 3); return that degree.

    Raises InputError naming the missing key, the tensor whose shape is wrong, or the degree above 3.
    """
    missing = [k for k in PARAM_NAMES if k not in params]
    if missing:
        raise InputError(f"Gaussian parameters are missing {missing}; expected keys {list(PARAM_NAMES)}")
    n = params["means"].shape[0]
    shN = params["shN"]
    num_rest = shN.shape[1] if shN.dim() == 3 else -1
    expected = {
        "means": (n, 3),
        "scales": (n, 3),
        "quats": (n, 4),
        "opacities": (n,),
        "sh0": (n, 1, 3),
        "shN": (n, num_rest, 3),
    }
    for key, shape in expected.items():
        if tuple(params[key].shape) != shape:
            raise InputError(f"Gaussian parameter '{key}' has shape {tuple(params[key].shape)}, expected {shape}")
    degree = sh_degree_of(num_rest)
    if degree is None:
        raise InputError(
            f"Gaussian parameter 'shN' has {num_rest} coefficients per channel, not (D+1)^2 - 1 for any SH degree D"
        )
    if degree > MAX_SH_DEGREE:
        raise InputError(
            f"Gaussian parameter 'shN' has {num_rest} coefficients per channel: SH degree {degree}, "
            f"above the highest gsrecon renders ({MAX_SH_DEGREE})"
        )
    return degree
