# Sourced on the GPU machine by gpu_vs_gsplat.sh and gpu_bench.sh: installs the carried wheels (.whl, gsplat's
# examples' pycolmap) into /tmp/site, sets the environment both trainers run in, builds fused-ssim (the CUDA SSIM
# simple_trainer.py trains with) and gsplat's kernels once per machine, and prints the GPU and versions.
for needed in .whl .gsplat_examples/simple_trainer.py; do
  [ -e "$needed" ] || { echo "$needed is missing: carry it (scripts/gpu_wheels.sh, scripts/fetch_gsplat_examples.sh)" >&2; exit 2; }
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .gsplat_examples/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD" TORCH_EXTENSIONS_DIR="$PWD/.torch_extensions" PYTHONUNBUFFERED=1 MAX_JOBS=16
export GSRECON_CACHE="$PWD/.gpu_data/cache"  # the LPIPS backbone, also AlexNet for gsplat's torchmetrics LPIPS
if ! python3 -c "import fused_ssim" 2>/dev/null; then
  python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target /tmp/site .gsplat_examples/src/fused-ssim
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, gsplat, tyro, fused_ssim, pycolmap; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gsplat', gsplat.__version__, 'tyro', tyro.__version__)"
cat .gsplat_examples/TAG
# gsplat's kernels compile on first import (about a minute): here, so that no run's wall time includes it.
python3 -c "from gsplat.cuda._backend import _C; assert _C is not None, 'gsplat CUDA kernels did not build'"
