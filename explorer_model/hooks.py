"""Named identity hook points, in the manner of TransformerLens.

A HookPoint returns its input unchanged unless a function is attached. Attached functions are global
state on the model, so they are only ever added through `HookedModule.hooks()`, a context manager that
removes them on exit whatever happens inside.
"""
from __future__ import annotations

import fnmatch
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fns:
            out = fn(x, self)
            if out is not None:
                x = out
        return x

    @property
    def active(self) -> bool:
        return bool(self.fns)

    def extra_repr(self) -> str:
        return self.name


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
        layer_set = None if layers is None else {int(l) for l in layers}
        chosen = []
        for name in self.hook_dict:
            if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
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
                hp = self.hook_dict[name]
                hp.fns.append(fn)
                added.append((hp, fn))
            yield self
        finally:
            for hp, fn in added:
                hp.fns.remove(fn)

    def reset_hooks(self) -> None:
        for hp in self.hook_dict.values():
            hp.fns.clear()
