"""Bad input everywhere it enters: the prompt box, the URL, the model path (app), the CLI and the Python API.

Each case must end in one clear message and leave the rest working: no exception element in the app (and
the previous model still drawing), exit status 2 with a single `llama-explorer: error: ...` line from the
CLI. Loader cases already covered through the API in test_loaders.py and through the CLI in test_cli.py
are not repeated; here they go through the app's model box, plus the cases nobody covered yet.
"""
import json
import os
import pickle
import re
import subprocess
import sys
import types

import pytest
from conftest import no_hang
import torch

# torch's unpickler warns about the protocol of the hostile pickles on its way to refusing them
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")

from apptest_util import all_text, decode, figures, run_app
from explorer_model import cli
from explorer_model.loaders import LoadError, load

ODD = {  # prompts that reach the tokenizer and every panel
    "nul_and_controls": "Hello\x00world\x07 bell\x1b[31m red\x7f and\u200bzero-width\r\nend",
    "rtl": "مرحبا بالعالم and שלום עולם mixed with English",
    "emoji_zwj": "👩\u200d👩\u200d👧\u200d👦 family, 🏳️\u200d🌈 flag, 👨🏽\u200d💻 coder",
    "special_only": "<|im_start|><|im_end|>",
}
HUGE = 3 * 2**30  # sparse: takes no disk space, but reading it would take seconds and gigabytes


def one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("llama-explorer: error:") and "Traceback" not in err
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    return lines[0]


def page_ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not at.sidebar.error, [e.value for e in list(at.error) + list(at.sidebar.error)]


@pytest.fixture(scope="module")
def smol():
    from app import gateway

    return gateway._model("smollm2")  # the app's own cached copy, shared with the AppTests below


# --------------------------------------------------------------------------- prompts, Python API
@pytest.mark.parametrize("name", ["nul_and_controls", "rtl", "emoji_zwj"])
def test_odd_text_round_trips_through_the_tokenizer(smol, name):
    tok, text = smol.tokenizer, ODD[name]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # what the token view shows per token adds up to the exact bytes that were typed
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_only_special_tokens_become_exactly_those_tokens(smol):
    tok = smol.tokenizer
    ids = tok.encode(ODD["special_only"])
    assert [tok.piece(i) for i in ids] == ["<|im_start|>", "<|im_end|>"]
    assert all(tok.is_special(i) for i in ids)


def test_prompt_longer_than_the_model_context_is_cut(smol):
    from app import gateway

    short = types.SimpleNamespace(tokenizer=smol.tokenizer,
                                  model=types.SimpleNamespace(cfg=types.SimpleNamespace(max_seq_len=5)))
    ids, total = gateway._encode(short, "one two three four five six seven eight", max_tokens=256)
    assert len(ids) == 5 and total == 8
    assert ids == smol.tokenizer.encode("one two three four five six seven eight")[:5]


# --------------------------------------------------------------------------- prompts, app
def test_odd_prompts_draw_every_view(smol):
    """All oddities in one prompt, then a one-token prompt, through every view: nothing breaks."""
    from app.panels import VIEWS

    mixed = " ".join(ODD.values())
    at = run_app(view="tokens", prompt="warm up")
    for text in (mixed, "<|im_end|>"):
        at.sidebar.text_area(key="prompt").set_value(text).run()
        n = len(smol.tokenizer.encode(text))
        for view, *_ in VIEWS:
            at.segmented_control(key="view").set_value(view).run()
            page_ok(at)
            assert at.session_state["view"] == view
            assert at.sidebar.slider(key="token").max == max(n - 1, 1)
            if view == "attention":  # one row and column per token (of the ±24 window), whatever the text was
                assert decode(figures(at)[0]["data"][0]["z"]).shape == (min(n, 49), min(n, 49))


@pytest.mark.parametrize("name", list(ODD))
def test_odd_prompt_from_a_link(smol, name):
    at = run_app(view="tokens", prompt=ODD[name])
    page_ok(at)
    ids = smol.tokenizer.encode(ODD[name])
    assert at.sidebar.slider(key="token").max == max(len(ids) - 1, 1)
    assert at.query_params["prompt"] == ODD[name]  # the link written back reproduces the prompt exactly


def test_hundred_thousand_characters_are_refused_with_one_message(smol):
    from app import gateway as state

    text = ("The quick brown fox jumps over the lazy dog; 狐狸跳过了懒狗。 " * 2000)[:100_000]
    assert len(text) > state.prompt_char_limit()  # 32 characters per token of the 2048-token cap
    at = run_app(view="tokens", prompt=text)  # a link can carry any length (the text box stops at the limit)
    assert not at.exception
    assert [e.value for e in at.error] == [
        f"The prompt ({len(text):,} characters) is longer than this server takes ({state.prompt_char_limit():,} "
        "characters), or is not valid text. Nothing was run."]
    cut = text[:state.prompt_char_limit()]  # the longest prompt taken: tokens cut to the limit, with a notice
    at.sidebar.text_area(key="prompt").set_value(cut).run()
    page_ok(at)
    total = len(smol.tokenizer.encode(cut))
    notices = [w.value for w in at.warning if "only the first" in w.value]
    assert notices == [f"The prompt has {total} tokens; only the first {state.DEFAULT_MAX_TOKENS} are used "
                       "(token limit)."]
    assert at.sidebar.slider(key="token").max == state.DEFAULT_MAX_TOKENS - 1


def test_configured_token_cap_applies_locally(monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_MAX_TOKENS", "8")
    at = run_app(view="tokens", prompt="one two three four five six seven eight nine ten eleven twelve")
    page_ok(at)
    assert "only the first 8 are used" in all_text(at)
    assert at.sidebar.number_input(key="max_tokens").value == 8
    assert at.sidebar.slider(key="token").max == 7


# --------------------------------------------------------------------------- URL
def test_out_of_range_layer_and_head_in_the_url_are_clamped():
    at = run_app(view="attention", prompt="I love machine learning.", layer="40", head="9", token="-3")
    page_ok(at)
    assert (at.session_state["layer"], at.session_state["head"], at.session_state["token"]) == (29, 8, 0)
    assert at.query_params["layer"] == "29" and at.query_params["head"] == "8"
    at = run_app(view="attention", prompt="I love machine learning.", layer="99999999999999999999")
    page_ok(at)
    assert at.session_state["layer"] == 0  # beyond any integer a widget holds: start over
    at = run_app(view="attention", prompt="I love machine learning.", layer="2.5", head="1e3")
    page_ok(at)
    assert (at.session_state["layer"], at.session_state["head"]) == (0, 0)  # not a whole number: start over
    assert figures(at)


# --------------------------------------------------------------------------- CLI: prompts and token ids
@pytest.mark.parametrize("args, needle", [
    (["--token-ids", "-1"], "token id -1 is out of range"),
    (["--token-ids", "49152"], "token id 49152 is out of range"),  # the vocabulary is 0..49151
    (["--token-ids", "5," + "9" * 30], "out of range"),
    (["--token-ids", ", ,"], "no tokens"),
    (["--token-ids", ",".join(["1"] * 8193)], "context of 8192"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", " \n\t "], "prompt is empty"),
    (["--prompt", "word " * 20000], "context of 8192"),
])
def test_cli_bad_prompts_and_ids(tmp_path, capsys, args, needle):
    out = tmp_path / "r.npz"
    code = cli.main(["record", "smollm2", *args, "--out", str(out), "--names", "hook_embed"])
    one_line_error(code, capsys.readouterr().err, needle)
    assert not out.exists()


def test_cli_last_valid_token_id_is_accepted(tmp_path, capsys):
    out = tmp_path / "r.npz"
    assert cli.main(["record", "smollm2", "--token-ids", "0,49151", "--out", str(out), "--names", "hook_embed"]) == 0
    assert out.exists()


@pytest.mark.parametrize("name", list(ODD))
def test_cli_tokenizes_odd_text(smol, capsys, name):
    assert cli.main(["tokenize", "smollm2", "--text", ODD[name], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == smol.tokenizer.encode(ODD[name])


# --------------------------------------------------------------------------- model sources
class Evil:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def sparse(path, size=HUGE):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.fixture(scope="module")
def sources(ckpt, tmp_path_factory):
    """name -> (path, words the message must contain), each a broken model source not covered elsewhere."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("bad_sources")
    model = ckpt.hf_model("gqa", seed=3)
    out = {}

    hf = ckpt.save_hf(model, d / "hf_no_weights")
    (hf / "model.safetensors").unlink()
    out["hf_no_weights"] = (hf, ["no weights"])
    meta = d / "meta_no_pth"
    meta.mkdir()
    (meta / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2, "n_heads": 4, "norm_eps": 1e-5}))
    out["meta_no_pth"] = (meta, ["consolidated"])

    hf = ckpt.save_hf(model, d / "hf_truncated")
    data = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(data[: len(data) // 2])
    out["truncated_safetensors"] = (hf, ["model.safetensors", "not a readable safetensors"])
    meta = ckpt.write_meta(model, d / "meta_corrupt")
    data = (meta / "consolidated.00.pth").read_bytes()
    (meta / "consolidated.00.pth").write_bytes(data[: len(data) // 2])
    out["corrupt_pth"] = (meta, ["consolidated.00.pth", "truncated or corrupt"])
    gguf = ckpt.write_gguf(model, d / "cut.gguf")
    data = gguf.read_bytes()
    gguf.write_bytes(data[: len(data) // 2])
    out["truncated_gguf"] = (gguf, ["cut.gguf", "truncated or corrupt GGUF"])
    out["other_arch_gguf"] = (ckpt.write_gguf(model, d / "gpt2.gguf", arch="gpt2"), ["architecture", "gpt2"])

    hf = ckpt.save_hf(model, d / "hf_shape")
    state = load_file(hf / "model.safetensors")
    state["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 97)
    save_file(state, hf / "model.safetensors", metadata={"format": "pt"})
    out["hf_shape_mismatch"] = (hf, ["hf_shape", "shape"])
    meta = ckpt.write_meta(model, d / "meta_shape")
    params = json.loads((meta / "params.json").read_text())
    (meta / "params.json").write_text(json.dumps({**params, "n_layers": 3}))  # the weights hold two layers
    out["meta_shape_mismatch"] = (meta, ["meta_shape"])

    meta = ckpt.write_meta(model, d / "meta_pickle")
    torch.save({"tok_embeddings.weight": Evil(d / "PWNED_meta")}, meta / "consolidated.00.pth")
    out["pickle_pth"] = (meta, ["refusing", "consolidated.00.pth"])
    hf = ckpt.save_hf(model, d / "hf_pickle")
    (hf / "model.safetensors").unlink()
    with open(hf / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": Evil(d / "PWNED_hf")}, f)
    out["pickle_bin"] = (hf, ["pytorch_model.bin"])

    out["big_gguf"] = (sparse(d / "big.gguf"), ["big.gguf", "not a GGUF file"])
    out["big_bin"] = (sparse(d / "big.bin"), ["big.bin", "not a GGUF file, HF folder"])
    hf = ckpt.save_hf(model, d / "hf_big")
    (hf / "model.safetensors").unlink()
    sparse(hf / "model.safetensors")
    out["hf_big_safetensors"] = (hf, ["model.safetensors"])

    (d / "loop_a").symlink_to(d / "loop_b")
    (d / "loop_b").symlink_to(d / "loop_a")
    out["symlink_loop"] = (d / "loop_a", ["loop_a", "symbolic link"])
    return out


NAMES = ["hf_no_weights", "meta_no_pth", "truncated_safetensors", "corrupt_pth", "truncated_gguf",
         "other_arch_gguf", "hf_shape_mismatch", "meta_shape_mismatch", "pickle_pth", "pickle_bin", "big_gguf",
         "big_bin", "hf_big_safetensors", "symlink_loop"]


def no_side_effects(path):
    assert not list(path.parent.glob("PWNED*")), "a pickle payload ran"


@pytest.mark.parametrize("name", NAMES)
def test_bad_source_cli(sources, capsys, monkeypatch, name):
    path, needles = sources[name]
    if path.is_file():
        with open(path, "rb") as f:
            gguf = f.read(4) == b"GGUF"
        if not gguf:  # refused by its first bytes: never read whole (a sparse file claims gigabytes)
            from explorer_model.loaders import gguf as G

            monkeypatch.setattr(G, "file_sha256", lambda p: pytest.fail(f"{p} was hashed whole"))
    with no_hang(60):  # a refusal must not wait on the file's claimed size (speed: bench, not here)
        code = cli.main(["info", str(path)])
    one_line_error(code, capsys.readouterr().err, *needles)
    no_side_effects(path)


@pytest.mark.parametrize("name", NAMES)
def test_bad_source_in_the_app_keeps_the_previous_model(sources, name):
    path, needles = sources[name]
    at = run_app(view="attention", prompt="I love machine learning.")
    at.sidebar.selectbox(key="model_pick").set_value("__other__").run()
    with no_hang(120):
        at.sidebar.text_input(key="model_input").set_value(str(path)).run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and len(at.error) == 1, [e.value for e in at.error]  # at.error: the whole page
    assert "Still using smollm2" in errors[0] and "\n" not in errors[0]
    shown = re.sub(r"\\(.)", r"\1", errors[0])  # the text a visitor reads (the path is escaped, never markdown)
    for n in needles:
        assert n.lower() in shown.lower(), errors[0]
    assert at.session_state["active_model"] == "smollm2" and figures(at), "the previous model keeps working"
    assert at.query_params["model"] == "smollm2"
    no_side_effects(path)


@pytest.mark.parametrize("name", ["big_bin", "symlink_loop"])
def test_bad_source_subprocess_fails_fast_and_small(sources, name):
    """A separate process: one line on stderr, quick, and without reading the 3 GB into memory."""
    path, needles = sources[name]
    # VmHWM: this process's peak RSS (ru_maxrss would include the parent's, inherited through fork)
    probe = ("import sys; from explorer_model.cli import main; code = main(sys.argv[1:]); "
             "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]); sys.exit(code)")
    r = subprocess.run([sys.executable, "-c", probe, "info", str(path)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))  # a hang ends in TimeoutExpired
    one_line_error(r.returncode, r.stderr, *needles)
    assert int(r.stdout.split()[-1]) < 1024 * 1024, "peak RSS above 1 GB: the file was read"  # kB


def test_bad_source_python_api_is_one_line(sources):
    for name in NAMES:
        path, needles = sources[name]
        with pytest.raises(LoadError) as e:
            load(path)
        assert "\n" not in str(e.value) and all(n.lower() in str(e.value).lower() for n in needles), (name, e.value)
