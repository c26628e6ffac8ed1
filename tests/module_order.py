"""The order in which `make test` hands the test modules to its workers (tests/conftest.py calls it)."""
from __future__ import annotations

import collections


def longest_first(items) -> None:
    """Order the modules so the long ones start first: the browser modules, then those with slow tests, then the
    rest; among the browser and slow modules, those with fewer tests first (a module of one or two tests that drives
    a browser, servers or child processes is among the longest), among the rest those with more tests first (there
    the count is what takes time: the short modules are left to fill the end). `make test` keeps this order
    (--no-loadscope-reorder): xdist would otherwise start the modules with the most tests first, which leaves
    the one-test browser modules for the end, queued behind each other on one worker while the others idle.
    A module's tests stay together and in their order."""
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    count = collections.Counter(module(item) for item in items)
    group: dict[str, int] = {}
    for item in items:
        rank = 0 if item.get_closest_marker("browser") else 1 if item.get_closest_marker("slow") else 2
        group[module(item)] = min(group.get(module(item), 2), rank)
    def rank(item):
        g, n = group[module(item)], count[module(item)]
        return g, -n if g == 2 else n, module(item)
    items.sort(key=rank)
