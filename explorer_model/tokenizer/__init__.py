"""Tokenizers: one front end (frontend.py) over SentencePiece, tokenizer.json and GGUF vocabularies, whose
rebuild from GGUF metadata lives apart (gguf_vocab.py)."""
from .frontend import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, Tokenizer, TokenizerError
from .gguf_vocab import read_gguf_tokenizer_fields

__all__ = ["Tokenizer", "TokenizerError", "read_gguf_tokenizer_fields",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]
