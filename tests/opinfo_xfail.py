"""Expected failures of the OpInfo suite (tests/test_opinfo.py).

XFAIL maps (op name, variant, dtype, target) to the reason the op fails there; a
dtype or target of None matches every dtype or target.  An entry whose op passes
fails the test ("unexpectedly passed: remove the entry"), so this table may only
shrink.  A reason starts with "coil:" when the defect is coil's (then it names the
defect and the issue that tracks it), and with "outside coil:" when eager PyTorch,
Dynamo or AOTAutograd cannot run the op on its samples.
"""

from __future__ import annotations

import torch

F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64

Key = tuple[str, str, "torch.dtype | None", "str | None"]

XFAIL: dict[Key, str] = {
    # Dynamo rewrites addcdiv(x, a, b, value=v) as x + v * (a / b), three bfloat16 ops
    # that each round; backend="aot_eager" gives the same result (0.25 for eager's
    # 0.2129 where x + v * a / b cancels)
    ("addcdiv", "", BF16, None):
        "outside coil: Dynamo rewrites addcdiv(value=) into div, mul and add that each round to bfloat16 "
        "(aot_eager gives the same mismatch)",
}


def expected_failure(name: str, variant: str, dtype: torch.dtype, target: str) -> str | None:
    """The table's reason for this op, dtype and target, the most specific entry first."""
    for key in ((name, variant, dtype, target), (name, variant, dtype, None),
                (name, variant, None, target), (name, variant, None, None)):
        if key in XFAIL:
            return XFAIL[key]
    return None
