#!/usr/bin/env bash
# On the GPU machine: gsrecon against gsplat's own simple_trainer.py (bench_vs_gsplat.py) on the statuette at
# full resolution (data factor 1), 7000 steps, both trainers alternating. Extra arguments go to
# bench_vs_gsplat.py after the defaults (e.g. --strategies mcmc --seeds 0,1 --cap-max 1000000).
# Carry .whl and .gpu_data (scripts/gpu_wheels.sh) and .gsplat_examples (scripts/fetch_gsplat_examples.sh).
# Results: summary.md, summary.csv, runs.csv and logs.tar.gz (each run's log, gsplat's stats/*.json and
# cfg.yml, gsrecon's metrics.json, config.yaml and scalars.jsonl) in $OUT (else outputs/vs_gsplat).
# Four 7000-step runs and the builds (gsplat's kernels, fused-ssim) take about one 10-minute device call:
# run one strategy per call (--strategies default, then --strategies mcmc), then here
#   python scripts/bench_vs_gsplat.py --merge CALL1/runs.csv CALL2/runs.csv --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
out="${OUT:-outputs/vs_gsplat}"
work=/tmp/vs_gsplat
mkdir -p "$out" "$work"
[ -e .gpu_data/shared/statuette_colmap ] || { echo ".gpu_data/shared/statuette_colmap is missing: carry .gpu_data" >&2; exit 2; }
source scripts/gpu_gsplat_env.sh
# Stop the runs in time to collect what finished: a device command is killed at 600 s. VS_GSPLAT_SECONDS is this
# script's whole time, the builds above included.
status=0
timeout --kill-after=5 "$(( ${VS_GSPLAT_SECONDS:-540} - ($(date +%s) - start) - 10 ))" python3 scripts/bench_vs_gsplat.py --data .gpu_data/shared/statuette_colmap \
  --gsplat-examples .gsplat_examples --out "$work" --python python3 --factor 1 --steps 7000 --seeds 0,1 \
  --strategies default,mcmc "$@" || status=$?
cp "$work"/*.csv "$work"/*.md "$out"/ 2>/dev/null || true
(cd "$work" && tar -czf - --ignore-failed-read *.log */stats/*.json */cfg.yml */metrics.json */config.yaml \
  */scalars.jsonl */peak_gpu.json 2>/dev/null) > "$out/logs.tar.gz" || true
ls -la "$out"
exit "$status"
