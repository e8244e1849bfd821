"""Whether two checkpoints hold bit-identical tensors: the Gaussians, and every other tensor (optimiser moments,
strategy and per-view state, RNG states). Plain values are not compared: a timer's seconds differ between any two
runs.

A refactoring that must not change behaviour is checked by training the same run before and after it and
comparing the checkpoints, e.g.::

    git worktree add /tmp/before <base commit>
    (cd /tmp/before && python -m gsrecon train --config configs/synthetic.yaml max_steps=300 exp_dir=/tmp/a)
    python -m gsrecon train --config configs/synthetic.yaml max_steps=300 exp_dir=/tmp/b
    python scripts/compare_checkpoints.py /tmp/a/checkpoints/last.pt /tmp/b/checkpoints/last.pt

Prints the entries that differ and exits 1 when one does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths (``.params.means``, ``.optimizers.sh0.state.0.exp_avg``, ...) where ``a`` and ``b`` differ: a tensor
    of another dtype, shape or any other bit, or another set of keys."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{path} keys"] if a.keys() != b.keys() else []
        return found + [d for key in a.keys() & b.keys() for d in differences(a[key], b[key], f"{path}.{key}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for index, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{index}]")]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="a checkpoint (.pt)")
    parser.add_argument("second", help="the checkpoint to compare it with")
    args = parser.parse_args()
    first, second = (torch.load(path, map_location="cpu", weights_only=True) for path in (args.first, args.second))
    params = differences(first["params"], second["params"], "params")
    others = differences(*({k: v for k, v in c.items() if k not in ("params", "config")} for c in (first, second)))
    shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in first["params"].items())
    print(f"params ({shapes}): {'bit-identical' if not params else 'differ: ' + ', '.join(params)}")
    print(f"every other tensor: {'bit-identical' if not others else 'differs: ' + ', '.join(sorted(others))}")
    return 1 if params or others else 0


if __name__ == "__main__":
    sys.exit(main())
