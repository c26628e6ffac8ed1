"""The message catalogs: every key in both languages, the same placeholders, no text inline in the app's code,
no English sentence left in the Chinese catalog and no Chinese in the English one."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app import i18n

APP = Path(i18n.__file__).resolve().parent
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
# Words that stay as they are in the Chinese text: names of methods, functions and symbols.
TERMS = {
    "RMSNorm", "LayerNorm", "RoPE", "SwiGLU", "GLU", "SiLU", "ReLU", "GELU", "softmax", "Softmax", "token", "tokens",
    "logits", "logit", "lens", "FFN", "MLP", "GQA", "MHA", "KV", "BOS", "EOS", "bos", "Pre-Norm", "Post-Norm",
    "DeepNorm", "Pre", "Post", "Norm", "top-k", "top-p", "LLaMA", "Llama", "SmolLM2", "GGUF", "HF", "Meta", "PNG",
    "CSV", "npz", "URL", "AdamW", "Adam", "Xavier", "BPE", "SentencePiece", "UTF-8", "QR", "FLOPs", "dtype",
    "float32", "float16", "bfloat16", "Transformer", "Shakespeare", "Hamlet", "ln1", "ln2", "ln_final", "gate",
    "up", "down", "sink", "nats", "bits", "Q", "K", "V", "W", "Plotly", "warmup", "warm-up", "lr", "seed",
}


def messages(lang: str) -> dict[str, str]:
    return i18n.catalog(lang)


def test_both_catalogs_have_the_same_keys_and_no_empty_message():
    en, zh = messages("en"), messages("zh")
    assert sorted(set(en) ^ set(zh)) == []
    assert [k for k in en if not en[k].strip()] == []
    assert [k for k in zh if not zh[k].strip()] == []


def test_placeholders_agree_between_languages():
    en, zh = messages("en"), messages("zh")
    assert [k for k in en if i18n.placeholders(en[k]) != i18n.placeholders(zh[k])] == []


def _visible_words(text: str) -> str:
    """A message without its placeholders, code spans, formulas and HTML tags."""
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"`[^`]*`|\$[^$]*\$|<[^<>]*>|\\\w+", " ", text)
    return text


def english_runs(text: str) -> list[str]:
    """Runs of two or more plain English words (technical terms aside): a fragment nobody translated."""
    s = re.sub(r"[A-Za-z][A-Za-z'’-]*", lambda m: "·" if m.group(0) in TERMS else m.group(0), _visible_words(text))
    return re.findall(r"\b[A-Za-z]{2,}(?:[ ,]+[A-Za-z]{2,})+\b", s)


def test_the_english_run_check_can_fail():
    assert english_runs("注意力 of the head") == ["of the head"]
    assert english_runs("每个 token 的 RMSNorm 除数 {layer}") == []


def test_no_english_sentence_in_the_chinese_catalog():
    assert {k: english_runs(v) for k, v in messages("zh").items() if english_runs(v)} == {}


def test_no_chinese_in_the_english_catalog():
    assert [k for k, text in messages("en").items() if CJK.search(_visible_words(text))] == []


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("t", "tr") and node.args:
                yield node


# the app's code, and the command-line modules that answer from the same catalogs
APP_FILES = sorted(p for p in APP.rglob("*.py")) + sorted(
    p for p in (APP.parent / "explorer_model").rglob("*.py") if "from app.i18n import" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", APP_FILES, ids=lambda p: str(p.relative_to(APP.parent)))
def test_app_code_holds_no_chinese_text(path):
    assert [i + 1 for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()) if CJK.search(line)] == []


def test_every_key_the_app_uses_exists_and_every_message_is_used():
    used, old_style = set(), []
    for path in APP_FILES:
        for call in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if len(call.args) > 1 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
                    old_style.append(f"{path.name}:{call.lineno}")  # t(english, chinese): text inline
                used.add(first.value)
    assert old_style == []
    en = messages("en")
    # a key may also be chosen among literals (t("a.x" if c else "a.y"), tables of keys): any string literal of
    # the app's code that is a catalog key counts as a use
    for path in APP_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in en:
                used.add(node.value)
    assert sorted(k for k in used if k not in en) == []
    # keys built at run time (e.g. f"view.{key}") are listed in i18n.DYNAMIC_PREFIXES
    dynamic = tuple(getattr(i18n, "DYNAMIC_PREFIXES", ()))
    assert sorted(k for k in en if k not in used and not k.startswith(dynamic)) == []


def test_every_refusal_of_the_core_is_in_both_catalogs_the_english_word_for_word():
    from explorer_model.analysis.alignment import AlignmentError
    from explorer_model.interventions import SpecError
    from explorer_model.refusal import Refusal

    assert set(Refusal.__subclasses__()) == {SpecError, AlignmentError}  # a new kind joins this test
    en, zh = messages("en"), messages("zh")
    for kind in (SpecError, AlignmentError):
        assert {c: en.get(f"{kind.PREFIX}.{c}") for c in kind.MESSAGES} == kind.MESSAGES
        assert [c for c in kind.MESSAGES if f"{kind.PREFIX}.{c}" not in zh] == []
        assert kind.PREFIX + "." in i18n.DYNAMIC_PREFIXES


def test_lookup_fills_placeholders_and_strict_mode_refuses_unknown_keys(monkeypatch):
    key = next(k for k, v in messages("en").items() if i18n.placeholders(v))
    values = {name: 7 for name in i18n.placeholders(messages("en")[key])}
    assert "{" not in i18n.t(key, "en", **values).replace("{{", "")
    monkeypatch.setenv("LLAMA_EXPLORER_STRICT_I18N", "1")
    with pytest.raises(KeyError):
        i18n.t("no.such.message", "zh")
