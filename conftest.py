"""Repository-wide pytest set-up: Triton kernels run on CPU tensors through the
interpreter, which must be chosen before triton is first imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
