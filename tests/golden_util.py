"""Golden-text comparison: COIL_UPDATE_GOLDEN=1 rewrites the expected files."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("COIL_UPDATE_GOLDEN") == "1" or not path.exists() and os.environ.get("CI") != "true":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text + "\n")
    expected = path.read_text().rstrip("\n")
    assert text == expected, f"printed IR differs from {path}:\n--- expected\n{expected}\n--- got\n{text}"
