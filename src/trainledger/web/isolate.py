"""Run one expensive library call in a forked child process that can be killed (issue 20).

A thread cannot be stopped: a planner or estimate request past its time limit kept computing after
the client had its 503. Each expensive request therefore runs in its own child, forked from the
server at request time (so it inherits the warm catalogs and costs milliseconds to start), under
a CPU-time and address-space limit (``RLIMIT_CPU``, ``RLIMIT_AS``; POSIX setrlimit(2)). Its answer
comes back over a pipe as a pickle. Past the request's deadline, or when the client goes away, the
parent sends SIGKILL and reaps the child: the work stops, it is not abandoned.

At most ``slots`` children run at once and at most ``queue`` requests wait for one; a request
beyond that is answered at once with 503 "busy, retry" instead of waiting (cheap requests never
go through this pool). Where ``os.fork`` does not exist the call runs in a thread (no kill).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

#: address space a request child may map beyond what it inherits (bytes); a hostile request fails with MemoryError instead
#: of pushing the host into swap. Planner requests on the largest catalog models stay well below it.
CHILD_MEMORY_BYTES = 2 << 30
#: scheduling niceness added to a request child (POSIX nice(2)): the server's event loop, which
#: answers the cheap requests, keeps priority over the expensive work
CHILD_NICE = 5
#: extra CPU seconds past the wall-clock budget before the kernel stops a child (SIGXCPU/SIGKILL).
CPU_SLACK_S = 2


class Busy(Exception):
    """Every slot is taken and the waiting line is full."""


class Crashed(Exception):
    """The child died without an answer (killed by a limit, or a bug)."""


class Outcome:
    """What a child sends back: a value, or an exception to raise in the parent."""

    def __init__(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value


def _rlimits(seconds: float) -> None:
    try:
        import resource

        cpu = int(seconds) + CPU_SLACK_S
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = _mapped_bytes() + CHILD_MEMORY_BYTES  # on top of what the fork already maps
        if hard == resource.RLIM_INFINITY or hard > cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or a limit already lower
        pass


def _mapped_bytes() -> int:
    """Virtual memory this process maps now (Linux /proc/self/statm, pages); 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _close_sockets() -> None:
    """Close the sockets the child inherited (the listening socket, every client connection).

    A child holding a copy of a connection would keep it open after the server closed it, and a
    client's FIN would not be seen while a child held the client's end (client and server in one
    process); a request's child needs none of them.
    """
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    import stat as _stat

    for fd in fds:
        try:
            if _stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass


def _child(fd: int, fn: Callable, args: tuple, seconds: float, convert: Callable[[BaseException], Any]) -> None:
    """In the child: compute, send (ok, value) and leave without running the parent's cleanup."""
    code = 0
    try:
        _close_sockets()
        try:  # below the server itself, so that cheap requests are scheduled first on a busy host
            os.nice(CHILD_NICE)
        except OSError:
            pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _rlimits(seconds)
        try:
            out = Outcome(True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - every failure travels back to the parent
            out = Outcome(False, convert(exc))
        try:
            data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps(Outcome(False, Crashed(f"unpicklable answer: {exc!r}")))
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except BaseException:  # noqa: BLE001
        code = 1
        try:
            traceback.print_exc(file=sys.stderr)
        except Exception:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class ProcessRunner:
    """Bounded pool of killable per-request children (see the module docstring)."""

    def __init__(self, slots: int, queue: int) -> None:
        self.slots, self.queue = slots, queue
        self._running = 0
        self._waiting = 0
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: CPU seconds children used, and how many were killed (the bench reports them)
        self.stats = {"children": 0, "killed": 0, "refused": 0}

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:
            self._sem, self._loop = asyncio.Semaphore(self.slots), loop
        return self._sem

    async def run(self, fn: Callable, args: tuple, seconds: float,
                  convert: Callable[[BaseException], Any], gone: Callable[[], Any] | None = None) -> Any:
        """fn(*args) in a child; raises the child's exception, TimeoutError past ``seconds``, or Busy."""
        sem = self._semaphore()
        deadline = time.monotonic() + seconds
        if sem.locked() and self._waiting >= self.queue:
            self.stats["refused"] += 1
            raise Busy()
        self._waiting += 1
        try:
            await _within(sem.acquire(), deadline)
        finally:
            self._waiting -= 1
        try:
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                raise asyncio.CancelledError()  # cancelled while the slot was granted: start nothing
            if gone is not None and await gone():
                raise asyncio.CancelledError()  # the client left while waiting: start nothing
            return await self._fork(fn, args, deadline, convert)
        finally:
            sem.release()

    async def _fork(self, fn: Callable, args: tuple, deadline: float, convert: Callable) -> Any:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            _child(w, fn, args, max(0.1, deadline - time.monotonic()), convert)
        os.close(w)
        self.stats["children"] += 1
        os.set_blocking(r, False)
        chunks: list[bytes] = []
        done: asyncio.Future = loop.create_future()

        def readable() -> None:
            try:
                while True:
                    b = os.read(r, 1 << 16)
                    if not b:
                        if not done.done():
                            done.set_result(None)
                        return
                    chunks.append(b)
            except BlockingIOError:
                return
            except OSError as exc:
                if not done.done():
                    done.set_exception(exc)

        loop.add_reader(r, readable)
        finished = False
        try:
            await _within(asyncio.shield(done), deadline)
            finished = True
        finally:
            loop.remove_reader(r)
            os.close(r)
            if finished:
                _reap(pid)
            else:  # deadline passed or the request was cancelled: the work stops now
                self.stats["killed"] += 1
                _kill(pid)
        if not chunks:
            raise Crashed("the worker process ended without an answer (a memory or CPU limit?)")
        out = pickle.loads(b"".join(chunks))
        if out.ok:
            return out.value
        raise out.value


async def _within(aw: Any, deadline: float) -> Any:
    """``await aw`` until the monotonic ``deadline`` (TimeoutError after it).

    ``asyncio.timeout`` (3.11+) rather than ``wait_for``, whose 3.11 version can swallow a
    cancellation that arrives as the awaited future completes (CPython gh-86296) — a request whose
    client left would then start its worker process anyway.
    """
    timeout = getattr(asyncio, "timeout_at", None)
    if timeout is None:
        return await asyncio.wait_for(aw, max(0.0, deadline - time.monotonic()))
    loop = asyncio.get_running_loop()
    async with timeout(loop.time() + max(0.0, deadline - time.monotonic())):
        return await aw


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "win32"
