"""Which records of a models-suite results file hold a measurement: every status
but "pending" and "skipped" (ok, ref, mismatch, fallback, error).  `--resume`
measures the others again (bench/models.py), and scripts/pinned_run.sh counts
these to tell which of two copies of a run is further on:

    python3 bench/measured.py FILE      prints the count (0 for a missing file)

Standard library only: the device's copy runs it before anything is installed."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

UNMEASURED = ("pending", "skipped")


def measured(record: dict[str, Any]) -> bool:
    return record.get("status") not in UNMEASURED


def count(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for r in json.load(f) if measured(r))


if __name__ == "__main__":
    print(count(sys.argv[1]))
