#!/usr/bin/env bash
# Train the built-in synthetic scene end to end on this machine and say where the outputs are.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
EXP="${EXP_DIR:-outputs/demo}"
gsrecon weights lpips || echo "(LPIPS weights unavailable: metrics.json will have lpips: null)"
gsrecon train --config configs/synthetic.yaml exp_dir="$EXP" --overwrite "$@"  # replaces the previous demo
python - "$EXP" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/metrics.json"))
print(f"final validation PSNR {m['mean']['psnr']:.2f} dB at step {m['step']} ({m['num_gaussians']} Gaussians)")
PY
echo "files:       config.yaml, checkpoints/, metrics.json, point_cloud.ply, tb/, train.log"
echo "tensorboard: .venv/bin/tensorboard --logdir $EXP/tb"
