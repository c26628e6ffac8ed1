"""Named identity hook points, in the manner of TransformerLens.

A HookPoint returns its input unchanged unless a function is attached. Attached functions are global
state on the model, so they are only ever added through `HookedModule.hooks()`, a context manager that
removes them on exit whatever happens inside. A function fires only for forward passes run by the thread
that attached it: the app shares one model among all visitors, and a panel calling e.g. `model.ln_final`
in one session must not land in a recording being made in another.
"""
from __future__ import annotations

import fnmatch
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]


class HookPoint(nn.Module):
    def __init__(self):
        super().__init__()
        self.name = ""  # filled by HookedModule.setup_hooks from the module tree
        self.fns: list[HookFn] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Skips nn.Module's call machinery (torch's own module hooks are never used on hook points): a decode
        # step passes ~700 hook points, and an unhooked one must cost an attribute test, not a dispatch.
        return self.forward(x) if self.fns else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fns:
            return x
        me = threading.get_ident()
        for fn in self.fns:
            if isinstance(fn, _Owned):
                if fn.thread != me:
                    continue
                fn = fn.fn
            out = fn(x, self)
            if out is not None:
                x = out
        return x

    @property
    def active(self) -> bool:
        """Whether a function fires for this thread (the model may then take a slower, observable path)."""
        me = threading.get_ident()
        return any(not isinstance(fn, _Owned) or fn.thread == me for fn in self.fns)

    def extra_repr(self) -> str:
        return self.name


_EDIT = threading.Lock()  # attaching and removing are read-modify-write of HookPoint.fns


class _Owned:
    """A hook function and the thread that attached it."""

    __slots__ = ("fn", "thread")

    def __init__(self, fn: HookFn):
        self.fn, self.thread = fn, threading.get_ident()


class HookedModule(nn.Module):
    """Base for a model whose HookPoints are named by their path in the module tree."""

    def setup_hooks(self) -> None:
        self.hook_dict: dict[str, HookPoint] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    def select_hooks(self, names: Iterable[str] | None = None, layers: Iterable[int] | None = None) -> list[str]:
        """Hook names matching any glob in `names` (all if None), restricted to `layers` for per-block hooks."""
        patterns = list(names) if names is not None else ["*"]
        exact = {p for p in patterns if not any(c in p for c in "*?[")}  # a set: a full name list stays fast
        globs = [p for p in patterns if p not in exact]
        layer_set = None if layers is None else {int(l) for l in layers}
        chosen = []
        for name in self.hook_dict:
            if name not in exact and not any(fnmatch.fnmatchcase(name, p) for p in globs):
                continue
            if layer_set is not None and name.startswith("blocks.") and int(name.split(".")[1]) not in layer_set:
                continue
            chosen.append(name)
        return chosen

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[str, HookFn]]) -> Iterator["HookedModule"]:
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name, fn in fwd_hooks:
                if name not in self.hook_dict:
                    raise KeyError(f"no hook point named {name!r}")
                hp, owned = self.hook_dict[name], _Owned(fn)
                with _EDIT:  # a new list, so a forward pass iterating the old one in another thread
                    hp.fns = hp.fns + [owned]  # neither skips nor repeats a function
                added.append((hp, owned))
            yield self
        finally:
            with _EDIT:
                for hp, owned in added:
                    hp.fns = [f for f in hp.fns if f is not owned]
