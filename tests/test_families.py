"""The tutorial's shape table without weights: the real LLaMA configs, their parameter counts against the published
totals, every tensor's shape, memory per dtype and the KV cache."""
from __future__ import annotations

import pytest
import torch

from explorer_model import families, memory
from explorer_model.families import FAMILIES

# Published totals: LLaMA paper (Touvron et al. 2023, Table 2), Llama-2 paper, Llama-3 model card.
PUBLISHED = {"LLaMA-1 7B": 6.74e9, "LLaMA-1 13B": 13.0e9, "LLaMA-1 33B": 32.5e9, "LLaMA-1 65B": 65.2e9,
             "Llama-2 7B": 6.74e9, "Llama-2 70B": 69.0e9, "Llama-3 8B": 8.03e9}


def _by_hand(c) -> int:
    """Parameters of a LLaMA written out from the architecture (independent of the model code)."""
    attn = c.d_model * c.n_heads * c.head_dim * 2 + c.d_model * c.n_kv_heads * c.head_dim * 2
    ffn = 3 * c.d_model * c.d_ff
    return c.vocab_size * c.d_model * 2 + c.n_layers * (attn + ffn + 2 * c.d_model) + c.d_model


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_totals_match_published(name):
    total = families.component_params(FAMILIES[name])["total"]
    assert total == _by_hand(FAMILIES[name])
    # published figures are rounded to 3 significant digits (65.2B is Meta's own rounding of 65.29B)
    assert total == pytest.approx(PUBLISHED[name], rel=0.0015)


def test_components_add_up():
    p = families.component_params(FAMILIES["Llama-2 70B"])
    assert p["total"] == sum(v for k, v in p.items() if k != "total")
    c = FAMILIES["Llama-2 70B"]
    assert p["attention"] == c.n_layers * (2 * 8192 * 8192 + 2 * 8192 * 1024)  # GQA: 8 KV heads of 128


def test_tensor_shapes_for_a_prompt():
    c = FAMILIES["Llama-3 8B"]
    s = families.tensor_shapes(c, 37)
    assert s["hook_embed"] == (1, 37, 4096)
    assert s["blocks.0.attn.hook_q"] == (1, 37, 32, 128) and s["blocks.0.attn.hook_k"] == (1, 37, 8, 128)
    assert s["blocks.0.attn.hook_pattern"] == (1, 32, 37, 37)
    assert s["blocks.0.mlp.hook_post"] == (1, 37, 14336) and s["logits"] == (1, 37, 128256)
    assert not any(k.startswith("blocks.1.") for k in s)
    every = families.tensor_shapes(c, 5, layers=None)
    assert sum(k.startswith("blocks.31.") for k in every) == sum(k.startswith("blocks.0.") for k in s)
    assert families.weight_shapes(c)["blocks.0.attn.k_proj.weight"] == (1024, 4096)


def test_memory_table_and_kv_cache():
    c = FAMILIES["LLaMA-1 7B"]
    rows = {r["dtype"]: r for r in families.memory_table(c, 2048)}
    assert rows["float32"]["weights"] == 4 * 6738415616 and rows["bfloat16"]["weights"] == 2 * 6738415616
    # K and V, 32 layers x 4096 values, per token: 0.5 MB in 16 bits (the tutorial's figure)
    assert rows["float16"]["kv_per_token"] == 2 * 32 * 4096 * 2 == 524288
    assert families.kv_cache_bytes_per_token(FAMILIES["Llama-2 70B"], torch.bfloat16) == 2 * 80 * 8 * 128 * 2
    assert rows["float32"]["runtime"] > rows["float32"]["kv_per_token"] * 2048
    assert rows["float32"]["total"] == rows["float32"]["weights"] + rows["float32"]["runtime"]


def test_recording_cost_grows_with_the_prompt():
    c = FAMILIES["LLaMA-1 7B"]
    small, big = (memory.recording_bytes(c, n, torch.float16) for n in (64, 128))
    assert 1.9 < big / small < 2.1  # activations are linear in n; derived attention keeps no n^2 tensor


def test_a_count_is_named_as_models_are_with_two_digits_below_ten():
    counts = (999, 880_000, 1_544_064, 9_960_000, 134_515_008, 6_738_415_616, 13_015_864_320, 65_286_000_000)
    assert [memory.count_text(n) for n in counts] == ["999", "880K", "1.5M", "10M", "135M", "6.7B", "13.0B", "65.3B"]
