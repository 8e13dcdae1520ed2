"""The one exception type coil raises for its own failures."""

from __future__ import annotations


class CoilError(RuntimeError):
    """An internal or user-facing failure, naming the stage and the FX node."""

    def __init__(self, message: str, *, stage: str | None = None, node: str | None = None) -> None:
        self.stage = stage
        self.node = node
        where = " ".join(p for p in (f"[{stage}]" if stage else "", f"(node {node})" if node else "") if p)
        super().__init__(f"{where} {message}".strip())
