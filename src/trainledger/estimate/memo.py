"""Remember a function's result for its last arguments, compared by object identity.

One ledger asks for the same derived figures several times with the same objects (the memory and
the serving section ask for the engine's memory in turn, the energy and the cost section for the
power model, ...). Comparing by identity costs nothing, unlike hashing pydantic models, and is
safe only for arguments that are immutable (frozen specs, frozen dataclasses) and results that
callers read and never change: the decorated functions must be called that way.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def last_call(fn: F) -> F:
    """``fn`` with its result remembered for the last positional arguments (by identity)."""
    last: list[tuple[tuple[Any, ...], Any] | None] = [None]

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        hit = last[0]
        if hit is not None and len(hit[0]) == len(args):
            for a, b in zip(hit[0], args):  # a loop, not all(genexpr): called often, this is cheaper
                if a is not b:
                    break
            else:
                return hit[1]
        out = fn(*args)
        last[0] = (args, out)
        return out

    wrapper.forget = lambda: last.__setitem__(0, None)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


#: every KeyedMemo made (module-level stores, created once at import): ``clear_keyed`` empties them
_KEYED: list[KeyedMemo] = []


def clear_keyed() -> None:
    """Empty every KeyedMemo (a cold estimate: ``memory.phases.clear_memos``)."""
    for memo in _KEYED:
        memo.clear()


class KeyedMemo:
    """Results remembered by a key the caller declares (what the computation reads of its inputs),
    at most ``size`` of them: the store is emptied whole when full (the keys of one estimate and its
    variants fit many times over). Results are shared: callers read them, never change them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._store: dict[Any, Any] = {}
        _KEYED.append(self)

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        hit = self._store.get(key)
        if hit is None:
            if len(self._store) >= self.size:
                self._store.clear()
            hit = self._store[key] = compute()
        return hit

    def clear(self) -> None:
        self._store.clear()

    def __len__(self) -> int:
        return len(self._store)
