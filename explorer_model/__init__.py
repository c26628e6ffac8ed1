"""LLaMA Explorer's model layer: an instrumented LLaMA, its recorder, loaders and tokenizers."""
import os

# OpenMP's busy-wait makes a forward 10-20x slower when another process holds a core; must be set
# before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .config import ConfigError, ModelConfig, RopeScaling  # noqa: E402
from .model import KVCache, LlamaModel  # noqa: E402

__all__ = ["ConfigError", "ModelConfig", "RopeScaling", "KVCache", "LlamaModel"]
