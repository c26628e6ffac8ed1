"""The command line: real runs on the default model, and one clear line (no traceback) for bad input."""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from explorer_model import cli
from explorer_model.paths import ASSETS

pytest.importorskip("gguf")


def run_cli(*args, timeout=120):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    return subprocess.run([sys.executable, "-m", "explorer_model.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("llama-explorer: error:")
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_info_json_on_default_model(capsys):
    assert cli.main(["info", "smollm2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cfg = info["config"]
    assert (cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"], cfg["d_model"]) == (30, 9, 3, 576)
    assert info["parameters"]["output"] == 0 and cfg["tie_embeddings"] is True
    assert 130e6 < info["parameters"]["total"] < 140e6
    assert info["kv_cache_bytes_per_token_fp32"] == 2 * 30 * 3 * 64 * 4
    assert info["decode_step"] == "compiled (native_step.c)"  # gcc is here: generate takes the C step


def test_info_names_the_decode_step_generate_takes(capsys, monkeypatch):
    assert cli.main(["info", "tiny-post", "--json"]) == 0  # Post-Norm: only the hooked forward's torch step
    assert json.loads(capsys.readouterr().out)["decode_step"].startswith("torch (the compiled step serves")
    monkeypatch.setenv("LLAMA_EXPLORER_NATIVE", "0")
    assert cli.main(["info", "tiny-pre", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_step"] == "torch (LLAMA_EXPLORER_NATIVE=0)"


def test_tokenize_json(capsys):
    assert cli.main(["tokenize", "smollm2", "--text", "<|im_start|>user 2024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"][0] == 1  # the special token is recognised in the text
    assert len(out["ids"]) == len(out["pieces"])
    # a character split over several tokens: its pieces named as the app names them, their bytes beside them
    assert cli.main(["tokenize", "--text", "深度", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["pieces"], out["bytes"]) == (["深·1/3", "深·2/3", "深·3/3", "度"], ["e6", "b7", "b1", "e5 ba a6"])
    # as a table, the bytes start in the same terminal column on every line: a Chinese character takes two
    assert cli.main(["tokenize", "--text", "深度 is"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "     177  '深·1/3'" + " " * 17 + "e6", "     132  '深·2/3'" + " " * 17 + "b7",
        "     126  '深·3/3'" + " " * 17 + "b1", "   43488  '度'" + " " * 21 + "e5 ba a6",
        "     314  ' is'" + " " * 20 + "20 69 73"]


@pytest.mark.parametrize("command", [["info"], ["tokenize", "--text", "hi"], ["record", "--prompt", "hi", "--out", "r.npz"],
                                     ["generate", "--prompt", "hi"], ["serve"]])
def test_every_command_takes_the_default_model_when_none_is_named(command):
    """--help says "smollm2 (default)" for every command's SOURCE: tokenize, record and generate required one."""
    assert cli.build_parser().parse_args(command).source == "smollm2"


def test_record_npz_with_globs(tmp_path, capsys):
    out = tmp_path / "rec.npz"
    assert cli.main(["record", "smollm2", "--prompt", "I love machine learning.", "--out", str(out),
                     "--names", "blocks.2.attn.hook_pattern", "blocks.*.ln1.hook_scale"]) == 0
    data = np.load(out)
    assert set(data.files) == {"blocks.2.attn.hook_pattern", "token_ids", "logits", "about"} | {
        f"blocks.{l}.ln1.hook_scale" for l in range(30)}
    from explorer_model.loaders import default_gguf_path

    assert json.loads(data["about"].item()) == {"model": "SmolLM2-135M-Instruct", "text": "I love machine learning.",
                                                "changes": [], "dtype": "float32", "source": str(default_gguf_path())}
    T = data["token_ids"].shape[1]
    assert data["blocks.2.attn.hook_pattern"].shape == (1, 9, T, T)
    assert data["logits"].shape == (1, T, 49152)


def test_record_token_ids_float16(tmp_path, capsys):
    out = tmp_path / "rec16.npz"
    assert cli.main(["record", "smollm2", "--token-ids", "504,3575,282", "--out", str(out), "--float16",
                     "--names", "hook_embed"]) == 0
    data = np.load(out)
    assert data["hook_embed"].dtype == np.float16 and data["token_ids"].tolist() == [[504, 3575, 282]]
    about = json.loads(data["about"].item())
    assert (about["text"], about["dtype"]) == (None, "float16")  # given ids, the file claims no text


def test_names_add_up_and_the_file_keeps_the_models_whole_path(tmp_path, capsys, monkeypatch):
    """--names given twice records both selections (as --intervene adds up); a model given by a relative path is
    named by its absolute one, which still finds it once the file is moved."""
    monkeypatch.chdir(ASSETS)
    out = tmp_path / "n.npz"
    assert cli.main(["record", "tiny-pre", "--prompt", "hi there", "--out", str(out), "--names", "hook_embed",
                     "--names", "blocks.0.hook_resid_post"]) == 0
    assert cli.main(["record", "./tiny-pre", "--prompt", "hi there", "--out", str(out), "--names", "hook_embed",
                     "--names", "blocks.0.hook_resid_post"]) == 0
    data = np.load(out)
    assert set(data.files) == {"hook_embed", "blocks.0.hook_resid_post", "logits", "token_ids", "about"}
    assert json.loads(data["about"].item())["source"] == str(ASSETS / "tiny-pre")


def test_a_changed_record_names_its_changes_and_the_patchs_source(tmp_path, capsys):
    out = tmp_path / "p.npz"
    assert cli.main(["record", "tiny-pre", "--prompt", "The bank approved the loan.", "--out", str(out),
                     "--names", "hook_embed", "--intervene", "no-mask,patch:blocks.1.hook_resid_post@-1",
                     "--patch-source", "The river bank.", "--intervene", "no-mask"]) == 0
    # several forms in one --intervene, as in a link; a change given twice is made (and named) once
    about = json.loads(np.load(out)["about"].item())
    assert about["changes"] == ["no-mask", "patch:blocks.1.hook_resid_post@-1"]
    assert (about["text"], about["patch_source"]) == ("The bank approved the loan.", "The river bank.")


def test_generate_greedy_paris():
    r = run_cli("generate", "smollm2", "--prompt", "The capital of France is", "--max-new-tokens", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"].startswith(" Paris")


def test_generate_prints_the_text_as_it_grows_and_keeps_it_on_ctrl_c(capsys, monkeypatch):
    """The text is written token by token (a Chinese character split over tokens once its last byte has come: no
    U+FFFD on the way), and is the JSON's text whole; Ctrl+C keeps what was generated (exit status 130)."""
    from explorer_model.generate import sampling

    args = ["generate", "smollm2", "--prompt", "深度学习是", "--max-new-tokens", "12"]
    assert cli.main([*args, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    writes: list[str] = []
    write = sys.stdout.write
    monkeypatch.setattr(sys.stdout, "write", lambda text: writes.append(text) or write(text))
    assert cli.main(args) == 0
    assert capsys.readouterr().out == "深度学习是" + whole["text"] + "\n"
    grown = writes[1:-1]  # after the prompt, before the line's end
    assert len(grown) >= 4 and "".join(grown) == whole["text"] and not any("\ufffd" in w for w in writes)
    choose, chosen = sampling.choose, []

    def interrupted(*a, **k):  # Ctrl+C while the fifth token is chosen
        if len(chosen) == 4:
            raise KeyboardInterrupt
        chosen.append(choose(*a, **k))
        return chosen[-1]
    monkeypatch.setattr(sampling, "choose", interrupted)
    writes.clear()
    assert cli.main(args) == 130
    out, err = capsys.readouterr()
    from explorer_model.loaders import load

    kept = load("smollm2").tokenizer.decode(whole["new_ids"][:4])
    assert out == "深度学习是" + kept + "\n" and chosen == whole["new_ids"][:4]
    assert err.strip() == "stopped by Ctrl+C after 4 new tokens"


def test_generate_sampling_is_reproducible_with_seed(capsys):
    args = ["generate", "smollm2", "--prompt", "Once upon a time", "--max-new-tokens", "5", "--temperature", "0.9",
            "--top-k", "40", "--top-p", "0.9", "--seed", "7", "--json"]
    assert cli.main(args) == 0
    a = json.loads(capsys.readouterr().out)["new_ids"]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["new_ids"] == a


@pytest.mark.parametrize("make_source, needle", [
    (lambda d: d / "nope", "no such file"),
    (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "not a GGUF"),
    (lambda d: (d / "junk.gguf").write_bytes(b"GGUF" + os.urandom(64)) and d / "junk.gguf", "junk.gguf"),
    (lambda d: d, "not a GGUF file, HF folder"),
])
def test_bad_sources_give_one_line(tmp_path, make_source, needle):
    src = make_source(tmp_path)
    r = run_cli("info", str(src))
    assert_one_line_error(r.returncode, r.stderr, needle)


@pytest.mark.parametrize("weights", ["none", "a shard the index lists is missing"])
def test_info_on_a_folder_without_its_weights_says_so_before_any_memory_table(tmp_path, capsys, weights):
    """A folder whose weights are still to be copied: its config and tokenizer read, but no memory table for a load
    that cannot happen (it printed one, then the refusal)."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(ASSETS / "tiny-pre", folder)
    (folder / "model.safetensors").unlink()
    needle = f"{folder}: no model.safetensors next to explorer_config.json"
    if weights != "none":  # the same folder as HF lays it out, sharded
        from checkpoints import hf_model, save_hf

        save_hf(hf_model(), folder, max_shard_size="100KB")
        shards = sorted(folder.glob("model-*.safetensors"))
        (folder / "explorer_config.json").unlink()
        shards[-1].unlink()
        needle = f"{shards[-1]}: shard listed in the index is missing"
        capsys.readouterr()  # transformers' own progress bar
    assert cli.main(["info", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(2, err, needle)


@pytest.mark.parametrize("command", [["info"], ["tokenize", "--text", "hi"], ["generate", "--prompt", "hi"],
                                     ["record", "--prompt", "hi", "--out", "r.npz"]])
def test_a_wrong_path_is_answered_without_importing_torch(tmp_path, command):
    """A typo in a path costs no import of torch (seconds): the answer comes at once."""
    code = ("import sys; from explorer_model.cli import main; status = main(sys.argv[1:]); "
            "print(status, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, command[0], str(tmp_path / "nope.gguf"), *command[1:]],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert "nope.gguf: no such file or folder" in r.stderr


def test_truncated_default_gguf(tmp_path):
    from explorer_model.loaders import default_gguf_path

    data = default_gguf_path().read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])
    r = run_cli("info", str(cut))
    assert_one_line_error(r.returncode, r.stderr, "cut.gguf")


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_hostile_pickle_is_refused_and_not_run(tmp_path):
    (tmp_path / "params.json").write_text(json.dumps({"dim": 8, "n_layers": 1, "n_heads": 2, "norm_eps": 1e-5}))
    with open(tmp_path / "consolidated.00.pth", "wb") as f:
        pickle.dump({"tok_embeddings.weight": Evil()}, f)
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["hello world", "a tiny corpus"] * 20), model_writer=model,
                                   vocab_size=30, model_type="bpe", minloglevel=2)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    r = subprocess.run([sys.executable, "-m", "explorer_model.cli", "info", str(tmp_path)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert_one_line_error(r.returncode, r.stderr)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("args, needle", [
    (["tokenize", "smollm2", "--text", "   "], "prompt is empty: give some text with --text"),
    (["info", "smollm"], "smollm: no such file or folder (the built-in models are smollm2, tiny-pre and tiny-post)"),
    (["info", str(ASSETS / "tiny-pre" / "explorer_config.json")], "(give the folder that holds it, not the file)"),
    (["record", "tiny-pre", "--prompt", "hi", "--out", "-"], "is not written to standard output ('-')"),
    (["record", "smollm2", "--prompt", "   ", "--out", "x.npz"], "prompt is empty: give some text with --prompt"),
    (["record", "smollm2", "--token-ids", "1,999999", "--out", "x.npz"], "out of range"),
    (["record", "smollm2", "--token-ids", "1,a", "--out", "x.npz"], "comma-separated"),
    (["record", "tiny-pre", "--token-ids", "1 2 3", "--out", "x.npz"], "comma-separated integers, got '1 2 3'"),
    (["record", "tiny-pre", "--token-ids", "1,,2", "--out", "x.npz"], "comma-separated integers, got '1,,2'"),
    (["record", "smollm2", "--prompt", "hi", "--out", "x.npz", "--names", "no.such.*"], "no hook point"),
    # each pattern on its own: a model named after --names is taken for a pattern, and must not pass unnoticed
    (["record", "--prompt", "hi", "--out", "x.npz", "--names", "hook_embed", "tiny-pre"],
     "--names 'tiny-pre' matches no hook point"),
    (["generate", "smollm2", "--prompt", "hi", "--top-p", "0"], "--top-p must be above 0 and at most 1, got 0.0"),
    (["generate", "--prompt", "hi", "--top-p", "1.5"], "--top-p must be above 0 and at most 1, got 1.5"),
    (["record", "--prompt", "hi", "--out", "x.npz", "--patch-source", "river"], "none is given"),
    (["record", "tiny-pre", "--prompt", "hi", "--out", "x.npz", "--intervene", "patch:blocks.1.hook_resid_post@-1",
      "--patch-source", " "], "the prompt is empty: give some text with --patch-source"),
    (["record", "--prompt", "hi", "--out", "x.npz", "--intervene", "no-mask", "--patch-source", "river"],
     "none is given"),
    (["record", "tiny-pre", "--prompt", "hi", "--out", "x.npz", "--intervene", "patch:blocks.1.hook_resid_post@-1",
      "--patch-source", "river", "--patch-source", "bank"], "--patch-source is given twice: give it once"),
    (["record", "tiny-pre", "--prompt", "hi", "--out", "x.npy"], "not a single .npy array; name it x.npz"),
    (["record", "tiny-pre", "--prompt", "hi", "--out", "model.gguf"], "not a GGUF model; name it model.npz"),
])
def test_bad_arguments_give_one_line(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    code = cli.main(args)
    assert_one_line_error(code, capsys.readouterr().err, needle)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("names, hint", [(["no.such.*"], False), (["hook_embed", "tiny-pre"], True)])
def test_names_matching_nothing_hint_at_the_model_only_when_one_stands_among_them(tmp_path, capsys, names, hint):
    assert cli.main(["record", "--prompt", "hi", "--out", str(tmp_path / "x.npz"), "--names", *names]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith("; the model goes before --names") == hint, line


@pytest.mark.parametrize("prompt, source, needle", [
    ("The king", "The queen", "position 10 does not exist in a prompt of length 3"),
    ("The king is dead and gone, and the queen is here", "The queen", "position 10 does not exist in the patch's source prompt of length 5"),
])
def test_a_patch_position_one_prompt_lacks_is_refused_before_anything_runs(tmp_path, capsys, prompt, source, needle):
    code = cli.main(["record", "tiny-pre", "--prompt", prompt, "--out", str(tmp_path / "x.npz"), "--intervene",
                     "patch:blocks.1.hook_resid_post@10", "--patch-source", source])
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, needle)
    assert out == "" and not (tmp_path / "x.npz").exists()  # no "recording 3 tokens: … will take" first


def test_tokenize_counts_a_text_longer_than_the_context(capsys):
    text = "the cat sat on the mat. " * 60  # ~370 tokens, where tiny-pre runs 256
    assert cli.main(["tokenize", "tiny-pre", "--text", text, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ids"]) > 256


def test_a_text_longer_than_a_command_line_is_read_from_a_file_or_standard_input(tmp_path, capsys, monkeypatch):
    """Linux holds at most 128 KB in one argument: --text-file / --prompt-file read the text (as an editor saved it:
    byte-order mark and last newline dropped), "-" from standard input."""
    import io

    text = "深度学习 is deep learning. " * 6000  # 144,000 characters, 258 KB of UTF-8
    (tmp_path / "long.txt").write_bytes(b"\xef\xbb\xbf" + text.encode() + b"\r\n")
    assert cli.main(["tokenize", "tiny-pre", "--text", text, "--json"]) == 0
    typed = json.loads(capsys.readouterr().out)["ids"]
    assert cli.main(["tokenize", "tiny-pre", "--text-file", str(tmp_path / "long.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == typed
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("the cat sat\n".encode())))
    assert cli.main(["record", "tiny-pre", "--prompt-file", "-", "--out", str(tmp_path / "r.npz"),
                     "--names", "hook_embed"]) == 0
    assert cli.main(["tokenize", "tiny-pre", "--text", "the cat sat", "--json"]) == 0
    ids = json.loads(capsys.readouterr().out.splitlines()[-1])["ids"]
    assert np.load(tmp_path / "r.npz")["token_ids"].ravel().tolist() == ids  # the newline is not a token


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read {path}: No such file or directory"),
    (b"\xff\xfecat", "{path} is not UTF-8 text (byte 0xff at offset 0)"),
    (b" \n", "{path} holds no text"),
    (b"a" * 800_001, "{path} holds more than 200,000 characters, the limit of a prompt"),
])
def test_a_prompt_file_that_cannot_be_a_prompt_gives_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "prompt.txt"
    if content is not None:
        path.write_bytes(content)
    for args in (["generate", "tiny-pre", "--prompt-file", str(path)], ["tokenize", "--text-file", str(path)]):
        assert_one_line_error(cli.main(args), capsys.readouterr().err, needle.format(path=path))


def test_generate_says_when_the_context_ends_it(capsys):
    prompt = "the cat sat on the mat. " * 26  # ~236 tokens of tiny-pre's 256
    assert cli.main(["generate", "tiny-pre", "--prompt", prompt, "--max-new-tokens", "80", "--temperature", "0",
                     "--json"]) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert len(shown["prompt_ids"]) + len(shown["new_ids"]) == 256 and len(shown["new_ids"]) < 80
    assert err.strip() == f"stopped after {len(shown['new_ids'])} new tokens: the model's context ends at 256 tokens"
    assert cli.main(["generate", "tiny-pre", "--prompt", "the cat", "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert capsys.readouterr().err == ""  # three tokens, as asked: nothing to say


def test_unwritable_output(tmp_path, capsys):
    code = cli.main(["record", "smollm2", "--prompt", "hi", "--names", "hook_embed", "--out",
                     str(tmp_path / "missing" / "dir" / "r.npz")])
    assert_one_line_error(code, capsys.readouterr().err, "cannot write")


def test_a_layer_the_model_lacks_names_the_layers_it_has(tmp_path, capsys):
    assert cli.main(["record", "tiny-pre", "--prompt", "hi there", "--out", str(tmp_path / "r.npz"),
                     "--intervene", "patch:blocks.20.hook_resid_post@-1", "--patch-source", "hello"]) == 2
    assert "layer 20 does not exist: the model has layers 0…5" in capsys.readouterr().err


def test_options_before_the_command_are_answered_with_the_right_order(capsys):
    assert cli.main(["--prompt", "hi", "record", "--out", "a.npz"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "llama-explorer: error: the command comes first, then its options: llama-explorer record --prompt … " \
                  "(see --help)", err
    assert cli.main(["smollm2", "info"]) == 2  # the model before the command
    assert capsys.readouterr().err.strip() == "llama-explorer: error: the command comes first, then its options: " \
                                              "llama-explorer info smollm2 … (see --help)"
    assert cli.main(["inf", "smollm2"]) == 2  # no command at all: argparse's own line names the choices
    assert "invalid choice: 'inf'" in capsys.readouterr().err
