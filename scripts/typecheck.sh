#!/usr/bin/env bash
# mypy over the installed layout of the `coil` package.  pyproject maps the
# top-level folders (ir/, passes/, backends/, properties/) into `coil`, which mypy
# cannot follow, so the check runs on a temporary tree of links shaped like it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/coil"
for f in "$root"/coil/*; do ln -s "$f" "$tree/coil/"; done
for d in backends ir passes properties; do ln -s "$root/$d" "$tree/coil/$d"; done
cd "$tree"
exec "${PYTHON:-python3}" -m mypy --config-file "$root/pyproject.toml" --cache-dir "$tree/.mypy_cache" -p coil
