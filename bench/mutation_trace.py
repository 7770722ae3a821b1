"""pytest plugin for bench/mutation.py: which functions of ``trainledger`` does each test call?

Loaded with ``-p mutation_trace`` (``bench/`` on ``PYTHONPATH``); writes
``{"tests": {nodeid: {"s": seconds, "f": ["estimate/x.py:LINE", ...], "sub": bool}}}`` to the path in
``MUTATION_TRACE_OUT``. A function is named by its file (relative to ``src/trainledger``) and the first
line of its code object (``co_firstlineno``: the first decorator's line for a decorated function).
Only ``call`` events are traced (no line tracing), so the overhead is one Python callback per call.
``sub`` marks a test that started a subprocess: what the child calls is invisible here, so the
probe runs such tests for every mutant whose module they can import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

_PKG_MARK = os.sep + "trainledger" + os.sep
_current: set[str] | None = None
_spawned = False
_results: dict[str, dict] = {}
_cache: dict[object, str | None] = {}


def _key(code) -> str | None:
    k = _cache.get(code, 0)
    if k == 0:
        f = code.co_filename
        i = f.rfind(_PKG_MARK)
        k = None if i < 0 or "site-packages" in f else f"{f[i + len(_PKG_MARK):]}:{code.co_firstlineno}"
        _cache[code] = k
    return k


# which catalog section a test reads, from the arguments of these functions (bench/mutation.py
# maps an architecture to its efficiency family): "<file>:<function>" -> tag from the frame's locals
WATCH = {
    "estimate/time/efficiency.py:for_gpu": lambda v: f"arch:{v['gpu'].architecture.lower()}",
    "estimate/time/efficiency.py:matmul_max": lambda v: f"dtype:{v['dtype']}",
    "estimate/time/efficiency.py:bytes_per_s": lambda v: f"link:{v['net'].kind}",
    "estimate/time/stack.py:stack_profile": lambda v: f"stackarch:{v['framework']}/{v['gpu'].architecture.lower()}",
    "estimate/time/stack.py:stack_values": lambda v: f"stack:{v['framework']}/{v['family']}",
}
_watched: dict[object, object] = {}


def _trace(frame, event, arg):
    if event == "call" and _current is not None:
        code = frame.f_code
        k = _key(code)
        if k is not None:
            _current.add(k)
            tag = _watched.get(code, 0)
            if tag == 0:
                tag = _watched[code] = WATCH.get(f"{k.rsplit(':', 1)[0]}:{code.co_name}")
            if tag is not None:
                try:
                    _current.add(tag(frame.f_locals))
                except Exception:  # noqa: BLE001 - an odd argument: no tag
                    pass
    return None


_orig_popen_init = subprocess.Popen.__init__


def _popen_init(self, *a, **kw):
    global _spawned
    _spawned = True
    return _orig_popen_init(self, *a, **kw)


def pytest_configure(config):
    subprocess.Popen.__init__ = _popen_init
    sys.settrace(_trace)
    threading.settrace(_trace)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current, _spawned
    _current, _spawned = set(), False
    if sys.gettrace() is not _trace:  # something (hypothesis, a debugger) replaced it: put it back
        sys.settrace(_trace)
    t0 = time.perf_counter()
    yield
    _results[item.nodeid] = {"s": round(time.perf_counter() - t0, 3), "f": sorted(_current),
                             "sub": _spawned}
    _current = None


def pytest_unconfigure(config):
    sys.settrace(None)
    threading.settrace(None)
    out = os.environ.get("MUTATION_TRACE_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump({"tests": _results}, fh)
