#!/usr/bin/env bash
# On the GPU machine: the LLFF protocol on horns with `gsrecon bench --peer gsplat` (gsplat's simple_trainer.py on the
# same scene, steps, images and test views; both with the 3DGS schedule scaled to the steps), one suite per
# "STEPS STRATEGY [KEY=VALUE ...]" argument, in order (default: 7000 default, 30000 mcmc, 7000 mcmc, 30000 default);
# STRATEGY is gsplat's, the KEY=VALUE pairs go to gsrecon's run alone ("7000 default strategy.name=multiview": gsrecon's
# multiview strategy beside gsplat's default, in $OUT/default_7000_multiview). MCMC runs with
# cap_max 1M: horns' 5,650 SfM points grow 5 % per refinement and pass 1M Gaussians near step 11k of a 30k run,
# which makes the 30000-step MCMC suite the >= 1M-Gaussian peak-memory comparison. A suite starts only while the
# time left of GPU_BENCH_SECONDS (this script's whole time, the builds included; default 540) holds its estimate;
# the skipped ones are named. Carry .whl, .gpu_data, .gsplat_examples and .torch_extensions (scripts/gpu_wheels.sh,
# scripts/fetch_gsplat_examples.sh). Each suite's results folder (results.md/csv, psnr_time.png, horns/*.json and
# the runs' logs) lands in $OUT/<strategy>_<steps> (else outputs/gpu_bench).
# On the CPU, GPU_BENCH_DRY=1 runs the same suite commands for real at 1/1000 of the steps without the peer (and
# without the CUDA set-up): the command lines, the schedule and MCMC options, the folders and tables (PYTHON names
# the interpreter with gsrecon's dependencies, e.g. .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
budget="${GPU_BENCH_SECONDS:-540}"
out="${OUT:-outputs/gpu_bench}"
work="${GPU_BENCH_WORK:-/tmp/gpu_bench}"
data="${GPU_BENCH_DATA:-.gpu_data/shared}"
[ -d "$data/horns" ] || { echo "$data/horns is missing: carry .gpu_data (scripts/gpu_wheels.sh)" >&2; exit 2; }
runs=("$@")
[ "${#runs[@]}" -gt 0 ] || runs=("7000 default" "30000 mcmc" "7000 mcmc" "30000 default")
declare -A estimate=([7000]=150 [30000]=330)  # seconds for both trainers and the scoring, on an H200 (a guess)
if [ "${GPU_BENCH_DRY:-0}" = 1 ]; then
  divisor=1000 peer=() estimate=([7000]=0 [30000]=0)
else
  divisor=1 peer=(--peer gsplat --gsplat-examples .gsplat_examples)
  source scripts/gpu_gsplat_env.sh
fi
mkdir -p "$out" "$work"
status=0
for run in "${runs[@]}"; do
  read -r steps strategy extra <<< "$run"
  overrides=(${extra:-})
  name="${strategy}_${steps}"
  [ -z "${extra:-}" ] || name="${name}_$(printf '%s' "${extra##*=}" | tr -c 'A-Za-z0-9_' '_')"
  left=$((budget - ($(date +%s) - start) - 10))
  if [ "$left" -lt "${estimate[$steps]:-330}" ]; then
    echo "skipped $name: about ${estimate[$steps]:-330} s needed, $left s left" | tee -a "$out/skipped.txt"
    continue
  fi
  rm -rf "${work:?}/$name"
  timeout --kill-after=5 "$left" "${PYTHON:-python3}" -m gsrecon bench llff --data "$data" --scenes horns --out "$work/$name" \
    --steps "$((steps / divisor))" --strategy "$strategy" --cap-max 1000000 --schedule 3dgs "${peer[@]}" \
    "${overrides[@]}" 2>&1 | tee "$out/$name.log" || status=$?
  mkdir -p "$out/$name"
  cp "$work/$name"/results.* "$work/$name"/psnr_time.png "$work/$name"/horns/*.json "$out/$name"/ 2>/dev/null || true
  cp "$work/$name"/horns/*.log "$work/$name"/horns/gsrecon/config.yaml "$out/$name"/ 2>/dev/null || true
done
ls -la "$out"
exit "$status"
