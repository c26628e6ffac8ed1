"""A finished figure's spec (Plotly's JSON read back into dicts), read and changed the way Plotly's graph objects are:
`fig.layout.xaxis.tickfont.size`, `axis.update(tickangle=-90, title_standoff=8)`, `tr.colorbar.title.text`.

The sizing of app/figure_layout.py and app/figure_text.py runs on every figure a page draws for a new selection.
On Plotly's graph objects each read and write goes through a validator (tens of µs); here it is a dict lookup.

As in Plotly, reading a property nobody set gives None, and reading an object nobody set (a title, a font, an axis)
gives an empty one that is created in the spec only when something is written into it. Which names are objects is
listed below: only those this app's sizing reads.
"""
from __future__ import annotations

import base64
import json
import math
import re

import numpy as np
import plotly.io

OBJECTS = {"title", "font", "tickfont", "colorbar", "margin", "legend", "hoverlabel", "textfont", "insidetextfont",
           "outsidetextfont", "pad"}
LAYOUT_OBJECTS = OBJECTS | {"coloraxis"}  # on a trace, `coloraxis` names the layout's; in the layout it is one
AXIS = re.compile(r"^[xy]axis\d*$")
COLORAXIS = re.compile(r"^coloraxis\d+$")  # a second shared colour scale (compare mode's B − A) is an object too


def spec(fig) -> dict:
    """A Plotly figure as the browser receives it (Plotly's JSON, arrays base64-typed), read back into plain dicts."""
    return json.loads(plotly.io.to_json(fig, validate=False))


class Node:
    """One object of a spec: its dict, or (not yet created) the parent and the name it will have there."""
    __slots__ = ("_d", "_parent", "_name")

    def __init__(self, d: dict | None, parent: "Node | None" = None, name: str = ""):
        object.__setattr__(self, "_d", d)
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_name", name)

    def _is_object(self, name: str) -> bool:
        return name in OBJECTS

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = None if self._d is None else self._d.get(name)
        if self._is_object(name):
            return Node(value if isinstance(value, dict) else None, self, name)
        return value

    def __setattr__(self, name: str, value) -> None:
        self._set(name, value)

    @property
    def plotly_name(self) -> str:
        return self._name

    def _made(self) -> dict:
        """This object's dict, created in its parent (and theirs) on the first write."""
        if self._d is None:
            object.__setattr__(self, "_d", self._parent._made().setdefault(self._name, {}))
        return self._d

    def _set(self, name: str, value) -> None:
        d = self._made()
        if value is None:
            d.pop(name, None)
        elif isinstance(value, dict):  # as Plotly's update: an object's dict is merged into what it has
            if not isinstance(d.get(name), dict):
                d[name] = {}
            Node(d[name]).update(**value)
        else:
            d[name] = value

    def update(self, **props) -> "Node":
        """Plotly's `update`: nested objects merged, `title_standoff` meaning title.standoff, None removing."""
        for key, value in props.items():
            *path, last = key.split("_")
            target = self
            for part in path:
                child = getattr(target, part)
                target = child if isinstance(child, Node) else Node(None, target, part)
            target._set(last, value)
        return self


class Layout(Node):
    __slots__ = ()

    def _is_object(self, name: str) -> bool:
        return name in LAYOUT_OBJECTS or AXIS.match(name) is not None or COLORAXIS.match(name) is not None

    @property
    def annotations(self) -> list[Node]:
        return [Node(a) for a in (self._d or {}).get("annotations") or []]


class Figure:
    """A spec as a figure: `data` (its traces), `layout`, and the update helpers the sizing uses."""
    __slots__ = ("spec", "data", "layout")

    def __init__(self, spec_dict: dict):
        self.spec = spec_dict
        root = Node(spec_dict)
        self.data = [Node(tr) for tr in spec_dict.setdefault("data", [])]
        self.layout = Layout(spec_dict.get("layout"), root, "layout")

    def update_layout(self, **props) -> None:
        self.layout.update(**props)

    def update_xaxes(self, **props) -> None:
        for axis in axes(self, "x"):
            axis.update(**props)

    def update_yaxes(self, **props) -> None:
        for axis in axes(self, "y"):
            axis.update(**props)


def axes(fig: Figure, letter: str) -> list[Node]:
    """The figure's x (letter "x") or y axes in subplot order (xaxis, xaxis2, …, xaxis10: by number, not by text)."""
    layout = fig.layout
    d = layout._d or {}
    extra = sorted((k for k in d if AXIS.match(k) and k[0] == letter and k != letter + "axis"),
                   key=lambda k: int(k[5:]))
    return [getattr(layout, letter + "axis")] + [getattr(layout, k) for k in extra]


def numbers(values) -> np.ndarray | None:
    """A trace's x or y as numbers: a list, or the spec's base64-typed array ({"dtype", "bdata"})."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
        return np.asarray(values, dtype=float)
    return None


def whole_span(fig: Figure, axis) -> float | None:
    """How far the traces on this numeric x axis reach (max - min), when every one of their x values is a whole
    number; None when one is not, or no trace has numbers there."""
    name, lo, hi = axis.plotly_name.replace("axis", ""), math.inf, -math.inf
    for tr in fig.data:
        if (tr.xaxis or "x") != name or tr.x is None:
            continue
        x = numbers(tr.x)
        if x is None or not x.size:
            return None
        x = x[np.isfinite(x)]
        if x.size and not np.all(x == np.round(x)):
            return None
        if x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return hi - lo if hi > lo else None


def x_extent(fig: Figure, axis) -> tuple[float, float] | None:
    """(lo, hi) the traces on this numeric x axis reach, a bar's from 0 (a horizontal bar's length is its x); None
    when no trace has numbers there or they all are one value."""
    name, lo, hi = axis.plotly_name.replace("axis", ""), math.inf, -math.inf
    for tr in fig.data:
        x = numbers(tr.x) if (tr.xaxis or "x") == name and tr.x is not None else None
        x = x[np.isfinite(x)] if x is not None else None
        if x is not None and x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
            if tr.type == "bar":
                lo, hi = min(lo, 0.0), max(hi, 0.0)
    return (lo, hi) if hi > lo else None


def fitting_step(lo: float, hi: float, most: int) -> float:
    """The finest step of 1, 2 or 5 × 10^k that puts at most `most` ticks inside [lo, hi] (two, where `most` is
    less): Plotly's own choice for nticks=most, a step at least (hi - lo) / most, can leave one tick inside them (a
    Δp axis from -0.19 to 0.12 labelled "0" alone), or none."""
    power = 10.0 ** math.floor(math.log10((hi - lo) / max(most, 1))) / 10
    while True:
        for k in (1, 2, 5):
            step = k * power
            if math.floor(hi / step + 1e-9) - math.ceil(lo / step - 1e-9) + 1 <= max(most, 2):
                return step
        power *= 10


def whole_step(rough: float) -> int:
    """The tick step of a whole-number axis: 1, 2, 5, 10, 20, 50… at least `rough`."""
    power = 1
    while True:
        for k in (1, 2, 5):
            if k * power >= rough:
                return k * power
        power *= 10


def log_ticks(fig: Figure, axis, letter: str) -> list[float] | None:
    """Tick values for a log axis whose data span too little for Plotly's own (a power of ten at most once in it,
    where Plotly labels one tick or none): 1, 2, 5 × 10^k inside the data, else four values spread evenly on the
    log scale at two significant digits. None when the data hold two powers of ten, or no positive numbers, or the
    figure chose its ticks itself."""
    if axis.tickvals is not None or axis.dtick is not None:
        return None
    name, found = axis.plotly_name.replace("axis", ""), []
    for tr in fig.data:
        values = numbers(getattr(tr, letter)) if (getattr(tr, letter + "axis") or letter) == name else None
        if values is not None:
            found.append(values[np.isfinite(values) & (values > 0)])
    data = np.concatenate(found) if found else np.array([])
    if not data.size or data.max() <= data.min():
        return None
    lo, hi = math.log10(data.min()), math.log10(data.max())
    if math.floor(hi) - math.ceil(lo) >= 1:
        return None
    nice = [k * 10.0 ** p for p in range(math.floor(lo), math.ceil(hi) + 1) for k in (1, 2, 5)]
    inside = [v for v in nice if lo <= math.log10(v) <= hi]
    if len(inside) >= 3:
        return inside
    return sorted({float(f"{10 ** x:.2g}") for x in np.linspace(lo, hi, 4)})


def y_of(fig: Figure, xa):
    """The y axis an x axis is anchored to (an empty one for a free axis)."""
    anchor = xa.anchor or "y"
    return getattr(fig.layout, "yaxis" + anchor[1:]) if re.fullmatch(r"y\d*", anchor) else Node(None)


def axis_categories(fig: Figure, axis, letter: str) -> list[str]:
    if isinstance(axis.categoryarray, list) and axis.categoryarray:
        return [str(c) for c in axis.categoryarray]
    name = axis.plotly_name.replace("axis", "")  # "xaxis2" -> "x2"
    cats: list[str] = []
    for tr in fig.data:
        if (getattr(tr, letter + "axis", None) or letter) != name:
            continue
        values = getattr(tr, letter, None)
        if not isinstance(values, list) or not values or not isinstance(values[0], str):
            continue
        cats += [str(v) for v in values if str(v) not in cats]
    return cats
