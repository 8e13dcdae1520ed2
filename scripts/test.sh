#!/usr/bin/env bash
# Set up, type-check (mypy), then run the whole test suite (CPU; Triton kernels through TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/typecheck.sh
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -n "${COIL_TEST_WORKERS:-2}" "$@"
