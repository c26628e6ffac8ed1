"""The order in which `make test` hands the test modules to its workers (tests/conftest.py calls it)."""
from __future__ import annotations

import collections


def longest_first(items) -> None:
    """Order the modules so the long ones start first: the browser modules, then those with slow tests, then the
    rest; among the browser and slow modules, those with fewer tests first (a module of one or two tests that drives
    a browser, servers or child processes is among the longest), among the rest the longest by a rough estimate
    first: its number of tests, ten times over for a module that drives the app (a page run or a server per test)
    and five times over for one that loads the real model, where a unit test takes a fraction of a second, so the
    unit modules fill the end. `make test` keeps this order
    (--no-loadscope-reorder): xdist would otherwise start the modules with the most tests first, which leaves
    the one-test browser modules for the end, queued behind each other on one worker while the others idle.
    A module's tests stay together and in their order."""
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    count = collections.Counter(module(item) for item in items)
    group: dict[str, int] = {}
    weight: dict[str, int] = {}
    for item in items:
        m = module(item)
        rank = 0 if item.get_closest_marker("browser") else 1 if item.get_closest_marker("slow") else 2
        group[m] = min(group.get(m, 2), rank)
        # a test of the app weighs ten unit tests, one of the real model five
        weight[m] = weight.get(m, 0) + (10 if item.get_closest_marker("app") else
                                        5 if item.get_closest_marker("real") else 1)

    def rank(item):
        m = module(item)
        return group[m], -weight[m] if group[m] == 2 else count[m], m
    items.sort(key=rank)
