#!/usr/bin/env bash
# Install gsrecon into .venv (if needed) and run the test suite. Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
gsrecon weights lpips || echo "(LPIPS weights unavailable: the LPIPS weight tests will skip)"
python -m pytest -q "$@"
