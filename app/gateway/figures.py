"""The gateway's figure cache: a figure (or a table) built once per (recording, view, selection, language,
presenter) and kept in the one result cache, counted by its bytes, so a view switch back to a recording already
seen, or a rerun that changes nothing the figure shows, costs no figure building.

A figure is named by what it is built from: the build function (module and name) and the values it closes over
or is given as `functools.partial(build, *values)`, digested (arrays by dtype, shape and bytes; a DataFrame by its
columns, values and index; a ViewContext by its recording and selection, its method `t` by the language alone;
functions by name and line). A partial takes its values when it is made: a figure given `ctx.labels` is named by the
labels, one that closes over `ctx` by all of it. A build function reads nothing else: no widget state, no session
state (the panel reads those and the closure captures them), so equal digests mean equal figures. A value of a
kind the digest does not know makes the figure uncached (built every time) rather than risk showing another
selection's figure.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
from typing import Callable

import numpy as np
import pandas as pd
import plotly.io

from app.figure_spec import spec
from app.gateway.lanes import FLIGHTS
from app.gateway.state import result_cache

class Undigestable(TypeError):
    """A closed-over value whose identity the digest cannot tell: the figure is built, not cached."""


def _feed(h, value, depth: int = 0) -> None:
    if depth > 6:
        raise Undigestable("nested too deep")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        h.update(f"nd:{arr.dtype}:{arr.shape};".encode())
        h.update(arr.view(np.uint8).data if arr.dtype != object else repr(arr.tolist()).encode())
    elif isinstance(value, pd.DataFrame):  # a table: its columns, their values and its index
        h.update(f"df:{value.shape}(".encode())
        for name in value.columns:
            _feed(h, name, depth + 1)
            _feed(h, value[name].to_numpy(), depth + 1)
        _feed(h, value.index.to_numpy(), depth + 1)
        h.update(b")")
    elif isinstance(value, np.generic):
        h.update(f"np:{value.dtype}:{value!r};".encode())
    elif isinstance(value, (list, tuple)) and len(value) > 8 and _all_of(value, float):  # a curve: one array
        h.update(f"{type(value).__name__}[floats]".encode())
        _feed(h, np.array(value, dtype=np.float64), depth + 1)
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__}[{len(value)}](".encode())
        for v in value:
            _feed(h, v, depth + 1)
        h.update(b")")
    elif isinstance(value, dict):
        h.update(f"dict[{len(value)}](".encode())
        for k in sorted(value, key=repr):
            _feed(h, k, depth + 1)
            _feed(h, value[k], depth + 1)
        h.update(b")")
    elif isinstance(value, types.MethodType):  # e.g. ctx.t: named by what the method reads of its object
        h.update(f"method:{value.__func__.__qualname__};".encode())
        reads = getattr(value.__self__, "method_reads", None)
        _feed(h, reads(value.__func__.__name__) if reads else value.__self__, depth + 1)
    elif isinstance(value, functools.partial):  # partial(build, *values): named by the function and the values
        h.update(b"partial(")
        _feed(h, value.func, depth + 1)
        _feed(h, value.args, depth + 1)
        _feed(h, value.keywords, depth + 1)
        h.update(b")")
    elif isinstance(value, types.FunctionType):
        # with its line: two lambdas of one function closing over the same values are two figures
        h.update(f"fn:{value.__module__}.{value.__qualname__}:{value.__code__.co_firstlineno};".encode())
        for cell in value.__closure__ or ():
            _feed(h, cell.cell_contents, depth + 1)
    elif hasattr(value, "figure_digest"):  # a ViewContext, a ModelFacts: what of it a figure may read
        _feed(h, value.figure_digest(), depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a model's config
        h.update(f"dc:{type(value).__qualname__}(".encode())
        for f in dataclasses.fields(value):
            _feed(h, getattr(value, f.name), depth + 1)
        h.update(b")")
    else:
        raise Undigestable(type(value).__name__)


def _all_of(values, kind: type) -> bool:
    return all(type(v) is kind for v in values)


def digest(build: Callable) -> str | None:
    """What names the figure `build` makes, or None when one of its closed-over values cannot be digested."""
    h = hashlib.blake2b(digest_size=16)
    try:
        _feed(h, build)
    except (Undigestable, ValueError):
        return None
    return h.hexdigest()


def figure(build: Callable, finish: Callable, tag: tuple = ()):
    """finish(the built figure's spec), cached under the digest of `build` and `tag` (what `finish` adds: presenter
    mode, a width, a height); built every time when `build` closes over something the digest cannot name. The
    built figure is kept too, as its JSON under the digest alone: the same figure finished for another screen
    width (or for presenter mode, where the build does not read it) is not built again. What `finish` returns is
    what is kept: the JSON the browser receives and its size (a string and a small dict, measured by the cache
    like any result), not Plotly's graph objects. `finish` is given a fresh spec (plain dicts,
    app/figure_spec.py) each time: it may change it."""
    name = digest(build)
    if name is None:
        return finish(spec(build()))
    built = lambda: _once(("figure_spec", name), lambda: plotly.io.to_json(build(), validate=False))  # noqa: E731
    return _once(("figure", name, tag), lambda: finish(json.loads(built())))


def table(build: Callable, finish: Callable, tag: tuple = ()):
    """A table's finish(build()) (the Arrow table Streamlit sends), named and kept as a figure is."""
    name = digest(build)
    if name is None:
        return finish(build())
    return _once(("table", name, tag), lambda: finish(build()))


def _once(key: tuple, compute: Callable):
    """compute() kept under key, computed by one page at a time however many ask for it together."""
    return result_cache().get(key, compute, FLIGHTS.one(key))
