"""Repository-wide pytest set-up: Triton kernels run on CPU tensors through the
interpreter, which must be chosen before triton is first imported.  A graph coil
cannot compile raises instead of running eagerly (Options.eager_fallback), so no
test passes on eager PyTorch's answer; the fallback's own tests turn it on.
AOTAutograd's cache (backends/aot_cache.py) is off: its entries live on disk,
shared by the test workers, so a graph two tests compile would be compiled by
whichever runs first and loaded by the other, and what a test sees would hang on
the order; tests/test_aot_cache.py turns it on for its own graphs."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("COIL_EAGER_FALLBACK", "0")
os.environ.setdefault("COIL_AOT_CACHE_NODES", "-1")
