"""Kernel calls without ctypes: a C entry point that takes the tensors themselves.

A ctypes call converts each argument in Python and the wrapper reads every
tensor's `data_ptr()` first: about 3 µs a launch, 0.2-0.3 ms of a MobileNetV2
inference step on one CPU thread (54 launches), where Inductor's compiled
bindings take the tensors and read their pointers in C.  coil does the same
with one small helper library, compiled once per machine and Python (cached
like the kernels, build.py), that makes a Python callable for any kernel of a
translation unit: `make(fn, pointers, sizes, data_ptr, Tensor)` gives an object
called as `kernel(t0, t1, ..., xnumel, rnumel, *sizes)`, which checks each
tensor argument is a torch.Tensor, reads its data pointer with torch's own C
function (`torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr`,
the one Inductor's bindings use), converts the integers and calls the kernel
with the GIL released, as ctypes does.

Every kernel argument is a pointer or an int64, which the x86-64 and AArch64
calling conventions pass alike (integer registers, then 8-byte stack slots), so
one switch over the argument count calls any kernel through a pointer to a
function of that many int64 parameters.  Where that does not hold (another
machine), or the helper cannot be built (no Python.h), or torch has no such
function, `launcher` falls back to the ctypes call with the pointers read in
Python: the same results, the old cost.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sysconfig
from typing import Any, Callable

import torch

log = logging.getLogger("coil")

MAX_ARGS = 96  # kernels with more arguments go through ctypes


def _source() -> str:
    cases = []
    for n in range(MAX_ARGS + 1):
        params = ", ".join(["int64_t"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: reinterpret_cast<void (*)({params})>(k->fn)({args}); break;")
    body = "\n".join(cases)
    return f"""// coil's kernel launcher (backends/cpp/fastcall.py)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstdint>
#include <exception>

namespace {{
struct Kernel {{
    void* fn;
    int pointers;
    int sizes;
    void* (*data_ptr)(PyObject*);
    PyTypeObject* tensor;
}};

void call(const Kernel* k, const int64_t* a, int n) {{
  switch (n) {{
{body}
  }}
}}

PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {{
    auto* k = static_cast<const Kernel*>(PyCapsule_GetPointer(self, "coil.kernel"));
    if (k == nullptr) return nullptr;
    int n = k->pointers + k->sizes;
    if (nargs != n) {{
        PyErr_Format(PyExc_TypeError, "coil kernel takes %d arguments, %zd given", n, nargs);
        return nullptr;
    }}
    int64_t a[{MAX_ARGS}];
    for (int i = 0; i < k->pointers; ++i) {{
        if (!PyObject_TypeCheck(args[i], k->tensor)) {{
            PyErr_Format(PyExc_TypeError, "coil kernel argument %d is not a tensor", i);
            return nullptr;
        }}
        // torch's data_ptr throws for a tensor whose data it refuses (a tracer's
        // FakeTensor): an error for the caller, never std::terminate past this frame
        try {{
            a[i] = reinterpret_cast<int64_t>(k->data_ptr(args[i]));
        }} catch (const std::exception& e) {{
            PyErr_Format(PyExc_RuntimeError, "coil kernel argument %d has no data to run on: %s", i, e.what());
            return nullptr;
        }} catch (...) {{
            PyErr_Format(PyExc_RuntimeError, "coil kernel argument %d has no data to run on", i);
            return nullptr;
        }}
    }}
    for (int i = k->pointers; i < n; ++i) {{
        long long v = PyLong_AsLongLong(args[i]);
        if (v == -1 && PyErr_Occurred()) return nullptr;
        a[i] = static_cast<int64_t>(v);
    }}
    Py_BEGIN_ALLOW_THREADS
    call(k, a, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}}

PyMethodDef launch_def = {{"coil_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(launch)),
                          METH_FASTCALL, "a coil kernel: tensors, then int64 sizes"}};

void release(PyObject* capsule) {{
    delete static_cast<Kernel*>(PyCapsule_GetPointer(capsule, "coil.kernel"));
}}
}}  // namespace

extern "C" PyObject* coil_fastcall_make(void* fn, int pointers, int sizes, void* data_ptr, PyObject* tensor) {{
    if (pointers < 0 || sizes < 0 || pointers + sizes > {MAX_ARGS}) {{
        PyErr_SetString(PyExc_ValueError, "coil kernel: too many arguments for the launcher");
        return nullptr;
    }}
    auto* k = new Kernel{{fn, pointers, sizes, reinterpret_cast<void* (*)(PyObject*)>(data_ptr),
                        reinterpret_cast<PyTypeObject*>(tensor)}};
    PyObject* capsule = PyCapsule_New(k, "coil.kernel", release);
    if (capsule == nullptr) {{
        delete k;
        return nullptr;
    }}
    PyObject* f = PyCFunction_New(&launch_def, capsule);
    Py_DECREF(capsule);
    return f;
}}
"""


def _data_ptr_fn() -> int | None:
    addr = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    addr = getattr(addr, "_torchinductor_pyobject_tensor_data_ptr", None)
    return addr if isinstance(addr, int) and addr else None


@functools.cache
def _maker(cache_dir: str | None) -> Any:
    """The helper's `coil_fastcall_make`, or None where it cannot be had here."""
    from coil.backends.cpp import build

    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64") or _data_ptr_fn() is None:
        return None
    include = sysconfig.get_paths().get("include")
    if not include:
        return None
    try:
        path = build.build_with_includes(_source(), (include,), cache_dir)
        lib = ctypes.PyDLL(path)
    except Exception as e:  # noqa: BLE001 - no Python.h, no compiler: kernels go through ctypes
        log.info("coil: the C++ kernel launcher is not available (%s); kernels are called through ctypes", e)
        return None
    make = lib.coil_fastcall_make
    make.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.py_object]
    make.restype = ctypes.py_object
    return make


def launcher(fn: Any, pointers: int, sizes: int, cache_dir: str | None = None) -> Callable[..., None]:
    """A callable for the ctypes function `fn` (its argtypes set: `pointers`
    data pointers, then `sizes` int64) that takes the tensors themselves."""
    make = _maker(cache_dir) if pointers + sizes <= MAX_ARGS else None
    if make is not None:
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        return make(addr, pointers, sizes, _data_ptr_fn(), torch.Tensor)  # type: ignore[no-any-return]

    def slow(*args: Any) -> None:
        fn(*[a.data_ptr() for a in args[:pointers]], *args[pointers:])

    return slow


def available(cache_dir: str | None = None) -> bool:
    """Whether kernels here are called through the C launcher."""
    return _maker(cache_dir) is not None
