#!/usr/bin/env bash
# gsrecon as a nerfbaselines method, end to end: `nerfbaselines train --method gsrecon --backend python` on a scene
# folder (COLMAP images/ + sparse/0/, or NeRF-synthetic transforms_*.json), then `nerfbaselines evaluate` on the
# test views it rendered. nerfbaselines 1.2.12 pins numpy<2 and gsrecon's venv has numpy 2, so this builds a venv of
# its own (NB_VENV, default .nbvenv, git-ignored) with `pip install -e .[nerfbaselines]` and torch from pip's usual
# sources (TORCH_VERSION, default 2.14.1); the first call takes minutes, later ones reuse it.
#   bash scripts/nerfbaselines_check.sh SCENE OUT [STEPS] [more nerfbaselines train options, e.g. --presets blender]
# Writes OUT/train (nerfbaselines' output: predictions-*, results-*.json, the saved method) and OUT/results.json
# (nerfbaselines evaluate's PSNR / SSIM / LPIPS of the test renders); prints the scores.
set -euo pipefail
cd "$(dirname "$0")/.."
scene="${1:?usage: nerfbaselines_check.sh SCENE OUT [STEPS] [nerfbaselines train options]}"
out="${2:?usage: nerfbaselines_check.sh SCENE OUT [STEPS] [nerfbaselines train options]}"
steps="${3:-30}"
shift $(( $# < 3 ? $# : 3 ))
venv="${NB_VENV:-.nbvenv}"
python="${PYTHON:-python3}"
if ! "$venv/bin/python" -c "import nerfbaselines, gsrecon.integrations.nerfbaselines" 2>/dev/null; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.14.1}" \
    -e ".[nerfbaselines]"
fi
"$venv/bin/python" -c "import numpy, nerfbaselines, torch; print('numpy', numpy.__version__, 'nerfbaselines', nerfbaselines.__version__, 'torch', torch.__version__)"
rm -rf "$out/train"
mkdir -p "$out"
# nerfbaselines' LPIPS loads torchvision's AlexNet / VGG16 through torch's hub: written there from gsrecon's LPIPS
# backbones (`gsrecon weights lpips`), since this machine may be offline.
export TORCH_HOME="${TORCH_HOME:-$out/torch_home}"
"$venv/bin/python" -c "import sys; from pathlib import Path; from gsrecon.integrations.nerfbaselines import \
write_torchvision_backbones as write; print(*write(Path(sys.argv[1]) / 'hub'))" "$TORCH_HOME"
"$venv/bin/nerfbaselines" train --method gsrecon --backend python --data "$scene" --output "$out/train" \
  --logger none --disable-output-artifact --set max_steps="$steps" --set num_threads=1 "$@"
predictions="$(ls -d "$out"/train/predictions-*.tar.gz "$out"/train/predictions-* 2>/dev/null | head -n 1)"
"$venv/bin/nerfbaselines" evaluate "$predictions" --output "$out/results.json"
cat "$out/results.json"
