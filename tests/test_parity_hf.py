"""Our model, loaded from a HF folder, gives the same logits as transformers' LlamaForCausalLM.

transformers is only the oracle here; explorer_model never imports it.
"""
import json

import pytest
import torch

pytest.importorskip("transformers")

import explorer_model.loaders as L  # noqa: E402
from explorer_model.loaders import LoadError  # noqa: E402

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py

TOL = 1e-4


def assert_parity(ours: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    assert ours.shape == ref.shape
    per_pos = (ours - ref).abs().amax(dim=(0, 2))  # [pos]
    assert per_pos[0] <= tol, f"position 0 differs by {per_pos[0]:.2e}"
    # Position 0 attends only to itself and RoPE is the identity there, so Q/K layout bugs show only later.
    assert per_pos[1:].max() <= tol, f"positions > 0 differ: {per_pos.tolist()}"


def load_and_compare(ckpt, folder, model, tol=TOL):
    tokens = ckpt.random_tokens()
    loaded = L.load(folder)
    assert loaded.format == "hf"
    assert_parity(loaded.model(tokens), ckpt.hf_logits(model, tokens), tol)
    return loaded


@pytest.mark.parametrize("case", ["gqa", "tied_llama3", "linear", "head_dim", "llama31", "mha", "bias"])
def test_hf_safetensors_parity(ckpt, tmp_path, case):
    model = ckpt.hf_model(case)
    folder = ckpt.save_hf(model, tmp_path / case)
    loaded = load_and_compare(ckpt, folder, model)
    c, cfg = model.config, loaded.model.cfg
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    assert cfg.tie_embeddings == c.tie_word_embeddings
    assert cfg.norm_eps == c.rms_norm_eps and cfg.rope_theta == c.rope_parameters["rope_theta"]
    kind = c.rope_parameters["rope_type"]
    assert (cfg.rope_scaling.kind if cfg.rope_scaling else "default") == kind
    if cfg.tie_embeddings:
        assert loaded.model.unembed.weight is loaded.model.embed.weight


def test_llama3_scaling_changes_frequencies(ckpt):
    """Case tied_llama3 is only a test of scaling if scaling moves some frequencies and keeps others."""
    from explorer_model.rope import inverse_frequencies
    from explorer_model.config import RopeScaling

    r = ckpt.CASES["tied_llama3"]["rope_parameters"]
    plain = inverse_frequencies(16, r["rope_theta"])
    scaled = inverse_frequencies(16, r["rope_theta"], RopeScaling.from_hf(r))
    assert (plain == scaled).any() and (plain != scaled).any()
    assert ((scaled != plain) & (scaled != plain / r["factor"])).any()  # the blended band is exercised


@pytest.mark.parametrize("case", ["gqa", "tied_llama3", "linear"])
def test_old_and_new_config_forms_agree(ckpt, tmp_path, case):
    model = ckpt.hf_model(case)
    new = ckpt.save_hf(model, tmp_path / "new")
    old = ckpt.save_hf(model, tmp_path / "old")
    written = ckpt.old_style_config(old)
    assert "rope_parameters" not in written and "rope_theta" in written
    assert "rope_parameters" in json.loads((new / "config.json").read_text())
    a = load_and_compare(ckpt, new, model)
    b = load_and_compare(ckpt, old, model)
    assert a.model.cfg.with_(name="") == b.model.cfg.with_(name="")


def test_sharded_safetensors(ckpt, tmp_path):
    model = ckpt.hf_model("gqa", seed=3)
    folder = ckpt.save_hf(model, tmp_path / "sharded", max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    load_and_compare(ckpt, folder, model)


def test_pytorch_model_bin(ckpt, tmp_path):
    model = ckpt.hf_model("gqa", seed=4)
    folder = tmp_path / "bin"
    ckpt.save_hf(model, folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    load_and_compare(ckpt, folder, model)


def test_without_qk_permutation_only_position_zero_agrees(ckpt, tmp_path, monkeypatch):
    """The parity check is sharp enough to catch a missing half-split -> adjacent conversion."""
    import explorer_model.loaders.hf as hf

    model = ckpt.hf_model("gqa")
    folder = ckpt.save_hf(model, tmp_path / "m")
    monkeypatch.setattr(hf, "hf_to_adjacent", lambda w, n: w)
    tokens = ckpt.random_tokens()
    diff = (L.load(folder).model(tokens) - ckpt.hf_logits(model, tokens)).abs().amax(dim=(0, 2))
    assert diff[0] <= TOL and diff[1:].max() > 1e-2


def test_hf_tokenizer_matches_tokenizers_library(ckpt, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    model = ckpt.hf_model("gqa")
    folder = ckpt.save_hf(model, tmp_path / "m")
    text = "The capital of France is Paris."
    ref = HFTokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    assert L.load(folder).tokenizer.encode(text) == ref


def test_untied_without_lm_head_is_an_error(ckpt, tmp_path):
    from safetensors.torch import load_file, save_file

    model = ckpt.hf_model("gqa")
    folder = ckpt.save_hf(model, tmp_path / "m")
    state = load_file(folder / "model.safetensors")
    del state["lm_head.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoadError, match="lm_head"):
        L.load(folder)
