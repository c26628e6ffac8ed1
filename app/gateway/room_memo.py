"""The room's shared state (loaded models, their facts, the result cache), kept by this process, not by Streamlit.

Streamlit's `st.cache_resource` is cleared for every visitor by one "clear cache" message, which any browser can
send over its websocket (the server honours it unconditionally). What the whole room shares lives here instead:
a small LRU per function, one computation per key however many visitors ask at once, cleared only by the process
itself (`fn.clear()`, as the tests do to rebuild the cache from changed settings).
"""
from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict


def room_memo(max_entries: int | None = None):
    """Decorator: fn's results kept per arguments; parameters named with a leading underscore are not part of
    the key (as with st.cache_resource: e.g. the loaded model a result is computed from)."""
    def wrap(fn):
        params = list(inspect.signature(fn).parameters)
        keyed = [i for i, p in enumerate(params) if not p.startswith("_")]
        items: OrderedDict = OrderedDict()
        computing: dict = {}
        lock = threading.Lock()

        @functools.wraps(fn)
        def memo(*args):
            key = tuple(args[i] for i in keyed if i < len(args))
            with lock:
                if key in items:
                    items.move_to_end(key)
                    return items[key]
                key_lock = computing.setdefault(key, threading.Lock())
            with key_lock:  # a second visitor asking for the same key waits for the first one's result
                with lock:
                    if key in items:
                        return items[key]
                value = fn(*args)
                with lock:
                    items[key] = value
                    while max_entries is not None and len(items) > max_entries:
                        items.popitem(last=False)
                    computing.pop(key, None)
                return value

        def clear() -> None:
            with lock:
                items.clear()

        memo.clear = clear
        return memo
    return wrap
