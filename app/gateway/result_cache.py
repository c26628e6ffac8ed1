"""One LRU cache of computed results, bounded by the bytes those results really hold.

Every kind of result the gateway (app/gateway/__init__.py) keeps lives here: recordings, what-if runs and their
rotated Q/K, logit-lens arrays, head sweeps, lab results, downloads. Each entry is measured by `nbytes`,
which counts a torch storage or numpy buffer once however many tensors or views share it (a Recording's
resid_post of layer L is resid_pre of layer L+1). Nothing here touches a model.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np
import torch


def nbytes(obj, seen: set | None = None) -> int:
    """Bytes held by obj: tensor storages and numpy buffers once each, plus containers and small objects."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = ("storage", storage.data_ptr(), storage.nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        key = ("ndarray", id(base))
        if key in seen:
            return 0
        seen.add(key)
        return base.nbytes
    if isinstance(obj, (bytes, bytearray, str, int, float, bool, type(None))):
        return sys.getsizeof(obj)
    if isinstance(obj, dict):
        return sys.getsizeof(obj) + sum(nbytes(k, seen) + nbytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sys.getsizeof(obj) + sum(nbytes(v, seen) for v in obj)
    if type(obj).__module__.startswith("pyarrow") and isinstance(getattr(obj, "nbytes", None), int):  # a table
        return obj.nbytes
    if hasattr(obj, "__dict__"):  # e.g. a Recording: its store of tensors, its config
        return sys.getsizeof(obj) + nbytes(vars(obj), seen)
    return sys.getsizeof(obj)


class ResultCache:
    """LRU of results keyed by tuples, evicting the oldest while the total exceeds `budget` bytes. A result bigger
    than the whole budget is served to the one who asked and never stored when `strict` (a shared server: the
    gateway refuses such runs before they start, see gateway_costs.admit); otherwise it stays as the only entry,
    so a local user can still study one long prompt.

    `get(key, compute, lock)` returns the cached value or computes it holding `lock` (the gateway's forward
    lock for anything that runs a model), checking again after the wait: two visitors asking for the same
    thing cause one computation.
    """

    def __init__(self, budget_bytes: int, on_evict: Callable[[], None] | None = None, strict: bool = False):
        self.budget, self.strict = budget_bytes, strict
        self._items: OrderedDict[tuple, object] = OrderedDict()
        self._bytes: dict[tuple, int] = {}
        self._lock = threading.Lock()  # guards the dicts only; computations run outside it
        self._on_evict = on_evict
        self.evictions = 0

    def peek(self, key: tuple):
        """The cached value or None, without computing."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def get(self, key: tuple, compute: Callable[[], object], lock=None):
        hit = self.peek(key)
        if hit is not None:
            return hit
        if lock is None:
            value = compute()
            self.put(key, value)
            return value
        with lock:
            hit = self.peek(key)  # another visitor may have computed it while we waited
            if hit is not None:
                return hit
            value = compute()
            evicted = self.put(key, value, notify=False)  # before the lock opens: the next waiter must find it
        if evicted and self._on_evict:  # returning freed memory to the system need not hold up the next forward
            self._on_evict()
        return value

    def put(self, key: tuple, value, notify: bool = True) -> int:
        """Store value (evicting the oldest while over budget); the number evicted. notify=False leaves calling
        on_evict to the caller."""
        size = nbytes(value)
        if self.strict and size > self.budget:
            return 0
        evicted = []
        with self._lock:
            self._items[key], self._bytes[key] = value, size
            self._items.move_to_end(key)
            while len(self._items) > 1 and sum(self._bytes.values()) > self.budget:
                old, gone = self._items.popitem(last=False)
                self._bytes.pop(old)
                evicted.append(gone)
            self.evictions += len(evicted)
        count = len(evicted)
        del evicted  # (a visitor still drawing one keeps its own reference until done)
        if count and notify and self._on_evict:
            self._on_evict()
        return count

    def stored_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    def kinds(self) -> dict[str, int]:
        """Bytes per kind of result (the first element of each key)."""
        with self._lock:
            out: dict[str, int] = {}
            for k, b in self._bytes.items():
                out[k[0]] = out.get(k[0], 0) + b
            return out

    def keys(self) -> list[tuple]:
        with self._lock:
            return list(self._items)

    def discard(self, kind: str) -> int:
        """Drop every entry of one kind (the first element of its key); how many were dropped."""
        with self._lock:
            gone = [k for k in self._items if k[0] == kind]
            for k in gone:
                del self._items[k], self._bytes[k]
            return len(gone)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes.clear()
