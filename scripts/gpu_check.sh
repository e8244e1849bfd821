#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: install the carried wheels (.whl/, from scripts/gpu_wheels.sh) if
# present, build gsplat's CUDA kernels once (cached in .torch_extensions/), run the GPU tests and a
# training benchmark. Extra arguments go to bench_train.py. The carried .gpu_data/ (gpu_wheels.sh)
# gives the tests ../shared/data and LPIPS its backbone.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  python3 -m pip install -q -e '.[dev]'
fi
if [ -d .gpu_data/shared ] && [ ! -d ../shared/data ]; then mkdir -p ../shared && cp -r .gpu_data/shared ../shared/data; fi
if [ -d .gpu_data/cache ]; then export GSRECON_CACHE="$PWD/.gpu_data/cache"; fi
export TORCH_EXTENSIONS_DIR="$PWD/.torch_extensions" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# A failing GPU test still leaves the benchmark to run; the script exits with the tests' status.
status=0
# -v: a test that aborts the process is named before it runs.
python3 -m pytest -v -m gpu -p no:cacheprovider --durations=5 tests/test_gpu.py || status=$?
python3 scripts/bench_train.py --config configs/synthetic.yaml --device cuda "$@"
exit "$status"
