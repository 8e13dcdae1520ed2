"""Cold and warm compile times, each in a fresh process (`bench.compile_once`).

cold:  caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1) and fresh, empty cache
       folders (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, COIL_CACHE_DIR).
prime: Inductor only: caches on, the same folders, still empty: Inductor's caches are
       only written when they are on, so this fills them (its time is kept too).
warm:  caches on, the folders the earlier runs filled.

The time is that of the first call (compile + run), measured inside the child."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CompileJob:
    suite: str
    workload: str
    variant: str  # inductor | coil
    target: str  # coil's target
    threads: int | None = None  # torch.set_num_threads in the child


_LIVE: set[int] = set()  # process groups of the children still running
_LIVE_LOCK = threading.Lock()
_STOPPED = threading.Event()  # set when the run is abandoned: start no more children


def allow_children() -> None:
    """A new run may start children again."""
    _STOPPED.clear()


def kill_children() -> None:
    """Stop every compile-timing child (and its compile workers) still running, and
    start no more."""
    _STOPPED.set()
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _env(root: str, caches_on: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
        TRITON_CACHE_DIR=os.path.join(root, "triton"),
        COIL_CACHE_DIR=os.path.join(root, "coil"),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    if not caches_on:
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    return env


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-400:]


def run_child(job: CompileJob, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """One child run: {"first_call_s": ...} or {"error": ...}."""
    cmd = [sys.executable, "-m", "bench.compile_once", "--suite", job.suite, "--workload", job.workload,
           "--variant", job.variant, "--target", job.target]
    if job.threads:
        cmd += ["--threads", str(job.threads)]
    with _LIVE_LOCK:
        if _STOPPED.is_set():
            return {"error": "stopped"}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        _LIVE.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: its compile workers too
        proc.communicate()
        return {"error": f"timeout after {timeout_s:.0f} s"}
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc.pid)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {_tail(err)}"}
    try:
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": f"no result line: {_tail(out + err)}"}


def phases(variant: str, cold_only: bool) -> list[tuple[str, bool]]:
    """(phase, caches on) in order.  coil's cold run already fills its cache."""
    if cold_only:
        return [("cold", False)]
    if variant == "inductor":
        return [("cold", False), ("prime", True), ("warm", True)]
    return [("cold", False), ("warm", True)]


def cold_and_warm(job: CompileJob, timeout_s: float, deadline: float, cold_only: bool = False) -> dict[str, Any]:
    """{"cold_s", "warm_s", ["prime_s"], ["error"]}; each run stops at the deadline."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix=f"bench-{job.variant}-{job.workload}-") as root:
        for phase, caches_on in phases(job.variant, cold_only):
            left = deadline - time.monotonic()
            if left < 5:
                result["error"] = f"{phase}: skipped (time budget)"
                break
            got = run_child(job, _env(root, caches_on), min(timeout_s, left))
            if "error" in got:
                result["error"] = f"{phase}: {got['error']}"
                break
            result[f"{phase}_s"] = got["first_call_s"]
    return result
