"""Repository-wide pytest set-up: Triton kernels run on CPU tensors through the
interpreter, which must be chosen before triton is first imported.  A graph coil
cannot compile raises instead of running eagerly (Options.eager_fallback), so no
test passes on eager PyTorch's answer; the fallback's own tests turn it on."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("COIL_EAGER_FALLBACK", "0")
