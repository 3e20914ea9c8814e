#!/usr/bin/env bash
# Create .venv and install nmt into it (editable, with the dev tools).
# --with-browser also installs Debian's chromium (as root, when missing) for the web-demo page test.
# torch is pinned first (PYTORCH_SPEC, default torch==2.13.0) and kept by a constraint while the rest
# installs, so pip never swaps in another build; set PYTORCH_SPEC to pick e.g. a CUDA wheel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
TORCH=${PYTORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH"
constraint=$(mktemp)
trap 'rm -f "$constraint"' EXIT
# (read from the package metadata: importing torch before numpy is installed prints a NumPy warning)
.venv/bin/python -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" > "$constraint"
# PYTHONWARNINGS: setuptools prints boxed notes about editable installs that say nothing to act on.
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -c "$constraint" -e ".[dev]"
.venv/bin/python -c "import torch, nmt; print('nmt installed in .venv with torch', torch.__version__)"
if [ "${1:-}" = "--with-browser" ] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "install chromium (e.g. sudo apt-get install chromium) for the web-demo page test" >&2
  fi
fi
