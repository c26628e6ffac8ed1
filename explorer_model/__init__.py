"""LLaMA Explorer's model layer: an instrumented LLaMA, its recorder, loaders and tokenizers."""
import os

# OpenMP's busy-wait makes a forward 10-20x slower when another process holds a core; must be set
# before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .config import ConfigError, ModelConfig, RopeScaling  # noqa: E402


def __getattr__(name: str):
    """The model's classes on first use: importing the package (the CLI checking its arguments, a settings
    read) does not load torch."""
    if name in ("KVCache", "LlamaModel"):
        from . import model
        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ConfigError", "ModelConfig", "RopeScaling", "KVCache", "LlamaModel"]
