#!/usr/bin/env bash
# Extract gsplat's examples/ (simple_trainer.py, its sibling modules and datasets/) at the tag of the installed
# gsplat version into .gsplat_examples/ (git-ignored; carry it to the GPU machine), for bench_vs_gsplat.py,
# with the two packages from git that its requirements.txt pins: pycolmap (rmbrualla's fork, pure Python,
# patched for NumPy 2: see below) as .gsplat_examples/wheels/*.whl and fused-ssim (a CUDA extension, built on the GPU machine by
# gpu_vs_gsplat.sh) as source in .gsplat_examples/src/fused-ssim.
#   bash scripts/fetch_gsplat_examples.sh GSPLAT_GIT [PYCOLMAP_GIT FUSED_SSIM_GIT]
# Each *_GIT is a clone (a bare one works) or a URL, cloned here; the last two default to GitHub's.
# GSPLAT_VERSION (default: what `.venv/bin/python -c "import gsplat; print(gsplat.__version__)"` prints)
# picks the tag.
set -euo pipefail
cd "$(dirname "$0")/.."
git_dir="${1:?usage: fetch_gsplat_examples.sh GSPLAT_GIT [PYCOLMAP_GIT FUSED_SSIM_GIT]}"
pycolmap_git="${2:-https://github.com/rmbrualla/pycolmap}"
fused_ssim_git="${3:-https://github.com/rahul-goel/fused-ssim}"
version="${GSPLAT_VERSION:-$(.venv/bin/python -c 'import gsplat; print(gsplat.__version__)')}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A local git folder as it is, a URL cloned bare into $tmp.
git_source() { if [ -d "$1" ]; then echo "$1"; else git clone -q --bare "$1" "$tmp/$2.git" && echo "$tmp/$2.git"; fi; }
git_dir="$(git_source "$git_dir" gsplat)"
tag="v${version}"
git --git-dir="$git_dir" rev-parse -q --verify "refs/tags/$tag" >/dev/null \
  || { echo "no tag $tag in $git_dir (git --git-dir=$git_dir tag lists them)" >&2; exit 2; }
rm -rf .gsplat_examples && mkdir -p .gsplat_examples
# The Python files only (file by file: a partial mirror may lack the tag's large binary blobs).
git --git-dir="$git_dir" ls-tree -r --name-only "$tag" examples | grep '\.py$' | grep -v '^examples/benchmarks/' |
  while read -r path; do
    mkdir -p ".gsplat_examples/$(dirname "${path#examples/}")"
    git --git-dir="$git_dir" show "$tag:$path" > ".gsplat_examples/${path#examples/}"
  done
git --git-dir="$git_dir" show "$tag:examples/requirements.txt" > .gsplat_examples/requirements.txt
echo "$tag $(git --git-dir="$git_dir" rev-parse "$tag^{commit}")" > .gsplat_examples/TAG
# The commits requirements.txt pins (git+https://github.com/OWNER/NAME@SHA).
pinned() { sed -n "s|^git+https://github.com/$1@\([0-9a-f]*\).*|\1|p" .gsplat_examples/requirements.txt; }
pycolmap_sha="$(pinned rmbrualla/pycolmap)" fused_ssim_sha="$(pinned rahul-goel/fused-ssim)"
mkdir -p .gsplat_examples/wheels .gsplat_examples/src/fused-ssim "$tmp/pycolmap"
git --git-dir="$(git_source "$pycolmap_git" pycolmap)" archive "$pycolmap_sha" | tar -x -C "$tmp/pycolmap"
# Its one line that NumPy 2 (on the GPU machine) refuses: np.uint64(-1) overflows there; the same value, 2^64-1.
sed -i 's/np\.uint64(-1)/np.uint64(np.iinfo(np.uint64).max)/' "$tmp/pycolmap/pycolmap/scene_manager.py"
grep -q 'np.uint64(np.iinfo(np.uint64).max)' "$tmp/pycolmap/pycolmap/scene_manager.py"
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .gsplat_examples/wheels "$tmp/pycolmap"
git --git-dir="$(git_source "$fused_ssim_git" fused-ssim)" archive "$fused_ssim_sha" ext.cpp ssim.cu ssim.h setup.py \
  fused_ssim LICENSE | tar -x -C .gsplat_examples/src/fused-ssim
echo "pycolmap $pycolmap_sha" >> .gsplat_examples/TAG
echo "fused-ssim $fused_ssim_sha" >> .gsplat_examples/TAG
cat .gsplat_examples/TAG
du -sh .gsplat_examples
