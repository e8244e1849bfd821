#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels the GPU machine lacks (its Python is 3.12 and it has
# torch, rich, tensorboard, torchmetrics, scipy, imageio, jaxtyping and ninja already).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# The second line: what gsplat's examples/simple_trainer.py adds (scripts/bench_vs_gsplat.py, gpu_vs_gsplat.sh).
for spec in gsplat==1.5.3 plyfile==1.1.5 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 lpips==0.1.4 pyyaml==6.0.3 \
    tyro==0.9.24 docstring-parser==0.18.0 typeguard==4.6.1 shtab==1.13.0 typing-extensions==4.16.0; do
  python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp "${platforms[@]}" \
    --only-binary=:all: -d .whl "$spec" || python3 -m pip download -q --no-deps -d .whl "$spec"
done
# imageio-ffmpeg: a gsrecon dependency the GPU machine lacks (videos; block training writes one), ~29 MB with its ffmpeg.
python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp "${platforms[@]}" --only-binary=:all: \
  -d .whl imageio-ffmpeg==0.6.0
# A package published only as source (antlr4-python3-runtime) is built into a wheel here: gpu_check.sh installs *.whl.
for sdist in .whl/*.tar.gz; do
  [ -e "$sdist" ] || continue
  python3 -m pip wheel -q --no-deps -w .whl "$sdist" && rm "$sdist"
done
ls -la .whl
# What the GPU tests and benchmarks read from this machine, staged in .gpu_data/ (git-ignored; carry it too):
# ../shared/data (absent on a user's clone) and the LPIPS backbone from the gsrecon cache.
mkdir -p .gpu_data/cache/weights
if [ -d ../shared/data ]; then rm -rf .gpu_data/shared && cp -r ../shared/data .gpu_data/shared; fi
lpips="${GSRECON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gsrecon}/weights/lpips_alex_backbone.pt"
if [ -f "$lpips" ]; then cp "$lpips" .gpu_data/cache/weights/; fi
du -sh .whl .gpu_data
