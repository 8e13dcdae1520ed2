#!/usr/bin/env bash
# Installs coil and what it needs.  Keeps an importable torch; where none is,
# installs torch==2.13.0 (the CPU build this machine keeps on disk).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q -e ".[test]"
