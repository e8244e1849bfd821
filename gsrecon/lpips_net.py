"""LPIPS v0.1 (Zhang et al. 2018) as the ``lpips`` package computes it, built from the layers it uses only.

``lpips.LPIPS`` builds torchvision's whole AlexNet / VGG16, classifier included (58M / 124M weights it never uses,
initialised from the global random generator and thrown away: about a second of a run's first validation), and
importing torchvision imports ``torch._dynamo`` (1.6-2 s more). :class:`LPIPS` holds only the convolutions of the
five feature slices and the calibrated 1x1 "linear" layers, takes their weights from files (nothing drawn at
random), and computes the same numbers with the same operations.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

# The feature layers of each backbone in torchvision's ``features`` numbering, up to the last one LPIPS reads:
# ("conv", stride, padding), ("relu",) or ("pool", kernel, stride). LPIPS reads the output of each slice's last layer.
_CONV_RELU = [("conv", 1, 1), ("relu",)]
_LAYERS: dict[str, list[tuple]] = {
    "alex": [("conv", 4, 2), ("relu",), ("pool", 3, 2), ("conv", 1, 2), ("relu",), ("pool", 3, 2)] + _CONV_RELU * 3,
    "vgg": [
        layer
        for block, convs in enumerate((2, 2, 3, 3, 3))
        for layer in [("pool", 2, 2)] * (block > 0) + _CONV_RELU * convs
    ],
}
_SLICE_ENDS = {"alex": (2, 5, 8, 10, 12), "vgg": (4, 9, 16, 23, 30)}  # lpips' slices: layers [previous end, end)
_SHIFT = (-0.030, -0.088, -0.188)  # lpips' ScalingLayer: ImageNet's mean and spread in [-1, 1] units
_SCALE = (0.458, 0.448, 0.450)


def lpips_linear_weights_path(net: str) -> Path:
    """The calibrated linear layers the ``lpips`` package ships for ``net`` (found without importing it: importing
    lpips imports torchvision)."""
    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("LPIPS needs the lpips package (pip install lpips)")
    return Path(spec.submodule_search_locations[0]) / "weights" / "v0.1" / f"{net}.pth"


class LPIPS(torch.nn.Module):
    """LPIPS v0.1 distance of ``net`` (``"alex"`` or ``"vgg"``) between images in [-1, 1].

    ``backbone``: the feature convolutions, keyed as lpips' backbone (``slice<k>.<i>.weight`` / ``.bias``) or as
    torchvision's (``features.<i>.weight``); ``linear``: lpips' linear layers (``lin<k>.model.1.weight``).

    Raises:
        KeyError: a weight is missing from ``backbone`` or ``linear``.
        RuntimeError: a weight has another shape than the network's.
    """

    def __init__(self, net: str, backbone: dict[str, Tensor], linear: dict[str, Tensor]) -> None:
        super().__init__()
        self.layers = _LAYERS[net]
        self.slice_ends = _SLICE_ENDS[net]
        self.register_buffer("shift", torch.tensor(_SHIFT)[None, :, None, None])  # [1, 3, 1, 1]
        self.register_buffer("scale", torch.tensor(_SCALE)[None, :, None, None])  # [1, 3, 1, 1]
        by_layer = {  # (index, "weight" | "bias") -> tensor, from either naming
            (int(index), kind): tensor
            for key, tensor in backbone.items()
            for prefix, index, kind in [key.split(".")]
            if prefix == "features" or prefix.startswith("slice")
        }
        self.convs = torch.nn.ParameterDict()
        for index, layer in enumerate(self.layers):
            for kind in ("weight", "bias") if layer[0] == "conv" else ():
                if (index, kind) not in by_layer:
                    raise KeyError(f"no {kind} of feature layer {index} in the LPIPS '{net}' backbone weights")
                self.convs[f"{kind}{index}"] = torch.nn.Parameter(by_layer[index, kind].float(), requires_grad=False)
        self.linear = torch.nn.ParameterList(
            torch.nn.Parameter(linear[f"lin{k}.model.1.weight"].float(), requires_grad=False)  # [1, C_k, 1, 1]
            for k in range(len(self.slice_ends))
        )
        channels = [self.convs[f"weight{self._last_conv(end)}"].shape[0] for end in self.slice_ends]
        if [w.shape[1] for w in self.linear] != channels:
            raise RuntimeError(f"LPIPS '{net}': the linear layers take {channels} channels, the backbone gives others")

    def _last_conv(self, end: int) -> int:
        """The index of the last convolution before layer ``end``."""
        return max(i for i in range(end) if self.layers[i][0] == "conv")

    def features(self, x: Tensor) -> list[Tensor]:
        """The five slices' outputs for images ``x`` [B, 3, H, W] already scaled."""
        outputs = []
        for index, layer in enumerate(self.layers):
            if layer[0] == "conv":
                x = F.conv2d(x, self.convs[f"weight{index}"], self.convs[f"bias{index}"], layer[1], layer[2])
            elif layer[0] == "relu":
                x = F.relu(x)
            else:
                x = F.max_pool2d(x, layer[1], layer[2])
            if index + 1 in self.slice_ends:
                outputs.append(x)
        return outputs

    def forward(self, in0: Tensor, in1: Tensor) -> Tensor:
        """The distance [B, 1, 1, 1] between ``in0`` and ``in1`` ([B, 3, H, W], values in [-1, 1])."""
        outs0 = self.features((in0 - self.shift) / self.scale)
        outs1 = self.features((in1 - self.shift) / self.scale)
        terms = [  # per slice [B, 1, 1, 1]
            F.conv2d((_unit_channels(out0) - _unit_channels(out1)) ** 2, weight).mean([2, 3], keepdim=True)
            for out0, out1, weight in zip(outs0, outs1, self.linear)
        ]
        return sum(terms[1:], terms[0])


def _unit_channels(features: Tensor, eps: float = 1e-10) -> Tensor:
    """``features`` [B, C, h, w] divided by their norm over the channels (lpips' ``normalize_tensor``)."""
    return features / (torch.sqrt(torch.sum(features**2, dim=1, keepdim=True)) + eps)
