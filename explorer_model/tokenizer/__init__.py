"""Tokenizers: one front end (frontend.py) over SentencePiece, tokenizer.json and GGUF vocabularies, whose
rebuild from GGUF metadata lives apart (gguf_vocab.py); pieces.py holds what both speak."""
from .frontend import MAX_PROMPT_CHARS, PromptError, Tokenizer, check_ids, check_prompt
from .pieces import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, TokenizerError
from .gguf_vocab import read_gguf_tokenizer_fields

__all__ = ["Tokenizer", "TokenizerError", "read_gguf_tokenizer_fields", "MAX_PROMPT_CHARS", "PromptError", "check_ids", "check_prompt",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]
