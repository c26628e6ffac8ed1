"""Every string a person reads in the app comes from the message catalogs `app/locales/en.po` and `zh.po`.

    t("attention.title", "zh", layer=3)        # the Chinese text of that message, {layer} filled in

Messages are looked up by key (`view.message`), so the English and the Chinese sentence each live in exactly one
place, in a format translators' tools (Poedit, Weblate, Babel) open. Numbers enter through named placeholders
(`{layer}`), which must be the same in both languages (tests/test_catalogs.py checks it, and that every key the
app uses exists in both catalogs). A key missing at run time shows the key itself and is logged; with
LLAMA_EXPLORER_STRICT_I18N=1 (set by the tests) it raises instead.
"""
from __future__ import annotations

import logging
import os
import string
from functools import lru_cache
from pathlib import Path

from babel.messages.pofile import read_po

LANGS = ("en", "zh")
# Key prefixes whose keys the app builds at run time (f"view.{key}"), so no literal t("...") names them;
# "interventions." and "alignment." are the model core's refusals (explorer_model/refusal.py), said by error_text.
DYNAMIC_PREFIXES = ("view.", "preset.", "sidebar.why.", "lecture.err.", "lecture.kind.", "lecture.edit_", "interventions.",
                    "alignment.")
LOCALES = Path(__file__).resolve().parent / "locales"
log = logging.getLogger("llama_explorer.i18n")


@lru_cache(maxsize=None)
def catalog(lang: str) -> dict[str, str]:
    """key -> text of one language, read once per server."""
    with open(LOCALES / f"{lang}.po", "rb") as f:
        cat = read_po(f, locale=lang)
    return {m.id: m.string for m in cat if m.id}


def placeholders(text: str) -> set[str]:
    """The named fields of a message: "{n} tokens of {total}" -> {"n", "total"}."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text) if name}


def t(key: str, lang: str = "en", **values) -> str:
    """The message `key` in `lang` ("en" or "zh"), with its placeholders filled from `values`."""
    text = catalog(lang if lang in LANGS else "en").get(key)
    if text is None:
        if os.environ.get("LLAMA_EXPLORER_STRICT_I18N") == "1":
            raise KeyError(f"message {key!r} is missing from the {lang} catalog")
        log.warning("message %r missing from the %s catalog", key, lang)
        return key
    return text.format(**values) if values else text


def translator(lang: str):
    """t with the language bound: tr = translator("zh"); tr("view.attention")."""
    return lambda key, **values: t(key, lang, **values)


def po_entry(key: str, text: str) -> str:
    """One catalog entry as .po text (for adding messages by script: append it to locales/<lang>.po)."""
    def quote(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\n", "\\n") + '"'
    lines = text.split("\n")
    parts = [quote(l + ("\n" if i < len(lines) - 1 else "")) for i, l in enumerate(lines)]
    body = parts[0] if len(parts) == 1 else '""\n' + "\n".join(parts)
    return f"msgid {quote(key)}\nmsgstr {body}\n\n"


def error_text(error, lang: str = "en") -> str:
    """An exception's one line in the visitor's language: a gateway refusal carries a catalog key, others are
    shown as they are."""
    key = getattr(error, "key", None)
    return t(key, lang, **error.values) if isinstance(key, str) and key in catalog("en") else str(error)
