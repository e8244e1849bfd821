#!/usr/bin/env bash
# Install the independent readers of gsrecon's web formats (npm packages, pinned) into .web_readers/:
# Khronos's glTF-Validator, Babylon.js (NullEngine in node), PlayCanvas's splat-transform and engine.
# Tests that use them skip cleanly where node, npm or this folder is missing; GSRECON_WEB_READERS points elsewhere.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${GSRECON_WEB_READERS:-$ROOT/.web_readers}"
PACKAGES=(
  gltf-validator@2.0.0-dev.3.10
  @babylonjs/core@9.28.0
  @babylonjs/loaders@9.28.0
  @playcanvas/splat-transform@3.7.0
  playcanvas@2.23.3
)
command -v npm >/dev/null || { echo "web readers: npm not found, their tests will skip"; exit 0; }
STAMP="$DEST/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PACKAGES[*]}" ]; then exit 0; fi
mkdir -p "$DEST"
[ -f "$DEST/package.json" ] || echo '{"private": true}' > "$DEST/package.json"
(cd "$DEST" && npm install --no-audit --no-fund --loglevel=error "${PACKAGES[@]}")
echo "${PACKAGES[*]}" > "$STAMP"
echo "web readers installed in $DEST"
