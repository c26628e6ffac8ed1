"""What the front end (frontend.py) and the GGUF vocabulary rebuild (gguf_vocab.py) both speak: token types,
byte pieces and the one error a tokenizer file raises."""
import re

# GGUF token types; the numbering is SentencePiece's ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's spelling of a raw byte


class TokenizerError(ValueError):
    """A tokenizer file is missing, truncated or not a tokenizer; the message is one line."""


def one_line(e: BaseException) -> str:
    """A library's error as one short line (its first line, at most 200 characters)."""
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
