#!/usr/bin/env bash
# On the GPU machine (issue 62's device program): lund at 1/4 as it is and with two textured boxes drawn into a run of
# its photos (scripts/make_distractors.py --seed 0), the transients module with delayed growth against off, seeds 0-2,
# 2000 steps, the gsplat renderer; each run's wall seconds (/usr/bin/time) and metrics.json into $OUT/runs.tsv.
# Carry .gpu_data (scripts/gpu_wheels.sh). Dry run on the CPU: GPU_TRANSIENTS_ARGS="device=cpu renderer.name=cpu
# max_steps=20 val_interval=20" SEEDS=0 OUT=/tmp/t bash scripts/gpu_transients.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_transients}"
data="${GPU_TRANSIENTS_DATA:-.gpu_data/shared}"
args="${GPU_TRANSIENTS_ARGS:-device=cuda renderer.name=gsplat max_steps=2000}"
[ -d "$data/lund" ] || { echo "$data/lund is missing: carry .gpu_data (scripts/gpu_wheels.sh)" >&2; exit 2; }
mkdir -p "$out"
boxes="$out/lund_boxes"
[ -d "$boxes" ] || python3 scripts/make_distractors.py "$data/lund" "$boxes" --seed 0 || exit 1
printf "capture\tsetting\tseed\twall_s\tpsnr\tssim\tlpips\tgaussians\n" > "$out/runs.tsv"
for seed in ${SEEDS:-0 1 2}; do
  for capture in lund lund_boxes; do
    path="$data/lund"; [ "$capture" = lund_boxes ] && path="$boxes"
    for setting in off transients; do
      extra=(); [ "$setting" = transients ] && extra=("views.transients={}")
      run="$out/runs/${capture}_${setting}_$seed"
      mkdir -p "$out/runs"
      /usr/bin/time -f "%e" -o "$run.time" python3 -m gsrecon train --data "$path" data.factor=4 seed="$seed" \
        exp_dir="$run" $args "${extra[@]}" > "$run.log" 2>&1 || { echo "failed: $run (see $run.log)" >&2; continue; }
      python3 - "$run" "$capture" "$setting" "$seed" >> "$out/runs.tsv" <<'PY'
import json, sys
run, capture, setting, seed = sys.argv[1:]
metrics = json.load(open(f"{run}/metrics.json"))
wall = open(f"{run}.time").read().split()[-1]
mean = metrics["mean"]
print("\t".join([capture, setting, seed, wall, *(f"{mean.get(k, float('nan')):.4f}" for k in ("psnr", "ssim", "lpips")), str(metrics["num_gaussians"])]))
PY
    done
  done
done
cat "$out/runs.tsv"
