#!/usr/bin/env bash
# On the GPU machine, one device call: scripts/gpu_check.sh (GPU tests + a synthetic training benchmark), then the
# side by side with gsplat's simple_trainer.py (scripts/gpu_vs_gsplat.sh, seed 0, default then MCMC) in the time
# that is left of DEADLINE_S seconds (default 560, inside a 600 s device call). Carry .whl, .gpu_data,
# .gsplat_examples and .torch_extensions (scripts/gpu_wheels.sh, scripts/fetch_gsplat_examples.sh). Logs and the
# comparison's tables land in $OUT (else outputs/gpu_session). GPU_PROGRAM=bench runs issue 58's program instead, the
# whole time: `gsrecon bench llff` on horns beside gsplat, default and MCMC, 7k and 30k steps, MCMC at cap_max 1M as the
# >= 1M-Gaussian memory run (scripts/gpu_bench.sh; arguments: which "STEPS STRATEGY" suites, in order).
# GPU_PROGRAM=transients runs issue 62's (scripts/gpu_transients.sh: lund with boxes, the transients module on gsplat).
# GPU_PROGRAM=multiview runs issue 57's: gsrecon's multiview strategy beside gsplat's default, and gsrecon's and
# gsplat's MCMC, on horns at 7000 then 30000 steps (scripts/gpu_bench.sh's suites; arguments replace that list).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
deadline="${DEADLINE_S:-560}"
out="${OUT:-outputs/gpu_session}"
mkdir -p "$out"
export MAX_JOBS=16
if [ "${GPU_PROGRAM:-vs_gsplat}" = transients ]; then  # issue 62: lund with and without boxes, off / transients
  OUT="$out/gpu_transients" timeout "$deadline" bash scripts/gpu_transients.sh 2>&1 | tee "$out/gpu_transients.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${GPU_PROGRAM:-vs_gsplat}" = multiview ]; then
  [ "$#" -gt 0 ] || set -- "7000 default strategy.name=multiview" "7000 mcmc" "30000 default strategy.name=multiview" \
    "30000 mcmc"
  OUT="$out/gpu_multiview" GPU_BENCH_SECONDS="$deadline" bash scripts/gpu_bench.sh "$@" 2>&1 | tee "$out/gpu_multiview.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${GPU_PROGRAM:-vs_gsplat}" = bench ]; then
  OUT="$out/gpu_bench" GPU_BENCH_SECONDS="$deadline" bash scripts/gpu_bench.sh "$@" 2>&1 | tee "$out/gpu_bench.log"
  exit "${PIPESTATUS[0]}"
fi
timeout 300 bash scripts/gpu_check.sh --at 1000,3000 2>&1 | tee "$out/gpu_check.log"
left=$((deadline - ($(date +%s) - start)))
echo "gpu_check took $(($(date +%s) - start)) s; $left s left for the side by side" | tee -a "$out/gpu_check.log"
VS_GSPLAT_SECONDS="$left" bash scripts/gpu_vs_gsplat.sh --seeds 0 "$@" 2>&1 | tee "$out/vs_gsplat.log"
