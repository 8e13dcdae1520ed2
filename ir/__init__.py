"""coil.ir: one module per IR language, plus expr, printer and verify.  Each loads
on first use as an attribute too: `import coil; coil.ir.printer.show(ir)`."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
