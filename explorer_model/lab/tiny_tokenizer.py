"""Train the twins' SentencePiece tokenizer: BPE with byte fallback, LLaMA 1's kind, on the corpus.

The settings copy LLaMA 1's tokenizer.model where they matter for what the Tokens view shows:
  - BPE pieces with "▁" marking a preceding space, and a dummy "▁" in front of the text (only there:
    a line after "\n" starts without "▁", as in LLaMA, so the trainer sees lines without the dummy
    prefix and learns "To" as well as "▁To"; the prefix is switched on in the saved model);
  - identity normalization and no whitespace squeezing, so text round-trips exactly;
  - digits split one by one;
  - byte fallback: a character without a piece (a rare Chinese character, a newline) becomes its
    UTF-8 bytes <0xE7><0x99><0xBD>, never <unk>;
  - <unk>=0, <s>=1, </s>=2.
Training is deterministic: one thread, every sentence used in file order, no shuffling.
"""
from __future__ import annotations

import io
from pathlib import Path

from .corpus import load_corpus
from ..paths import ASSETS

TOKENIZER_PATH = ASSETS / "tiny" / "tokenizer.model"
VOCAB_SIZE = 4000


def train_tokenizer(out: Path | None = TOKENIZER_PATH, vocab_size: int = VOCAB_SIZE, text: str | None = None) -> bytes:
    """Train on the training split (both languages) and return the model bytes, also written to `out`."""
    import sentencepiece as spm

    text = load_corpus("train") if text is None else text
    # SentencePiece trains on lines; blank lines carry nothing and newlines stay out of the vocabulary
    # (LLaMA also spells "\n" as the byte <0x0A>).
    sentences = [ln for ln in text.split("\n") if ln.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=0.9995,  # Chinese characters seen only once or twice fall back to bytes
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,  # see the module docstring; switched on below
        split_digits=True,
        allow_whitespace_only_pieces=True,
        max_sentence_length=1 << 14,
        input_sentence_size=0,  # use every sentence ...
        shuffle_input_sentence=False,  # ... in order: no sampling, so no randomness
        num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(model.getvalue())
    proto.normalizer_spec.add_dummy_prefix = True  # encode("To be") -> "▁To ▁be", like LLaMA
    data = proto.SerializeToString()
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    return data


if __name__ == "__main__":  # python -m explorer_model.lab.tiny_tokenizer [--vocab-size N] [--out PATH]
    import argparse
    import hashlib

    ap = argparse.ArgumentParser(description="Train assets/tiny/tokenizer.model on assets/corpus/")
    ap.add_argument("--out", type=Path, default=TOKENIZER_PATH)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    a = ap.parse_args()
    blob = train_tokenizer(a.out, a.vocab_size)
    print(f"{a.out}: {len(blob):,} bytes, sha256 {hashlib.sha256(blob).hexdigest()[:16]}")
