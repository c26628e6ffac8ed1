"""
One tokenizer interface over the three ways LLaMA-family models ship their vocabulary:
a SentencePiece `tokenizer.model`, a HF `tokenizer.json`, or GGUF metadata (rebuilt in gguf_vocab.py).

Encoding is delegated to the reference libraries (`sentencepiece`, `tokenizers`) rather than
reimplemented, because "exactly like the model's own tokenizer" is the whole point here.
GGUF vocabularies are rebuilt into one of those two libraries in memory:

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE in `tokenizers`, with the pre-tokenizer named by
  `tokenizer.ggml.pre` (smollm, gpt2/default, llama3/llama-bpe family, qwen2). Any other `pre` falls
  back to GPT-2's regex with a warning: exact for GPT-2-style vocabs, possibly off on digit and
  whitespace runs for others.
- `tokenizer.ggml.model == "llama"`: a SentencePiece ModelProto assembled from tokens/scores/types.
  It is always a BPE model, as llama.cpp's SPM tokenizer is, whatever the original .model was.

Control tokens typed in the text (`<s>`, `<|im_start|>`, ...) become single tokens for every kind.
SentencePiece cannot do this itself, so we split the text on control/unknown pieces first and encode
each chunk on its own; each chunk then gets the dummy-prefix space, like llama.cpp and HF's legacy
LlamaTokenizer. User-defined pieces are left to sentencepiece, which matches them in text natively.
"""

import json
import re
from pathlib import Path

from .labels import readable
from .pieces import BYTE_PIECE, CONTROL, NORMAL, UNKNOWN, TokenizerError, one_line

# The longest prompt accepted, in characters, checked before tokenizing: tokenizing costs ~80 bytes of memory
# per character (a 20-million-character prompt took 1.6 GB and tens of seconds before any token cap applied).
# 200,000 characters are ~16 MB and well over the 8192-token context of the models here at any chars/token.
MAX_PROMPT_CHARS = 200_000


class PromptError(ValueError):
    """A prompt that cannot be tokenized: too long, or not text (invalid UTF-8 / lone surrogates)."""


def check_prompt(text, limit: int = MAX_PROMPT_CHARS) -> str:
    """The prompt itself if it can be tokenized; else PromptError with one line. Call it before encode()
    on anything a person typed (CLI argument, API call, URL, text box)."""
    if not isinstance(text, str):
        raise PromptError(f"the prompt must be text, got {type(text).__name__}")
    if len(text) > limit:
        raise PromptError(f"the prompt has {len(text):,} characters, more than the limit of {limit:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as surrogates \udc80-\udcff
        bad = text[e.start]
        what = (f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF
                else f"lone surrogate U+{ord(bad):04X}")
        raise PromptError(f"the prompt is not valid UTF-8 text ({what} at character {e.start})") from None
    return text


def check_ids(ids, vocab_size: int, max_seq_len: int | None) -> list[int]:
    """Token ids a model can run, as a list; else PromptError with one line: at least one id, no more than the
    model's context (None: ids only counted, not run), each an index of its embedding."""
    ids = [int(i) for i in ids]
    if not ids:
        raise PromptError("the prompt has no tokens")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is out of range (the vocabulary has {vocab_size} tokens)")
    if max_seq_len is not None and len(ids) > max_seq_len:
        raise PromptError(f"the prompt has {len(ids)} tokens, more than this model's context of {max_seq_len}")
    return ids


def _bytes_to_unicode():
    # GPT-2's reversible map from bytes to printable unicode chars, so BPE never sees whitespace/control bytes
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def unknown_piece(token_id: int) -> str:
    """How an id without a piece in the tokenizer reads (an embedding row past the tokenizer's last piece)."""
    return f"[id={token_id}]"  # no space: the token labels would show it as ␣


class Tokenizer:
    """Use the from_* constructors; __init__ just wires a backend up."""

    def __init__(self, kind, tokens, special_ids, bos_id=None, eos_id=None, hf=None, sp=None,
                 byte_level=False, add_bos=False):
        self.kind = kind
        self.vocab_size = len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos  # whether the model expects BOS in front; encode() leaves it to the caller
        self._tokens = tokens  # id -> token string as the vocab spells it
        self._special = frozenset(special_ids)
        self._hf, self._sp, self._byte_level = hf, sp, byte_level
        self._special_re = None
        self._bytes: dict[int, bytes] = {}  # token_bytes' answers: pages ask for the same pieces at every run
        texts = sorted({tokens[i] for i in self._special if tokens[i]}, key=len, reverse=True)
        if sp is not None and texts:
            # longest first, so that e.g. "<|im_start|>" wins over a shorter control token it contains
            self._special_re = re.compile("|".join(map(re.escape, texts)))
            self._special_by_text = {}
            for i in sorted(self._special, reverse=True):  # lowest id wins on duplicate spellings
                self._special_by_text[tokens[i]] = i

    # ------------------------------------------------------------------ encode / decode

    def encode_prompt(self, text: str, add_bos: bool | None = None) -> list[int]:
        """encode() for text a person supplied: bounded to MAX_PROMPT_CHARS before any work, refused when it holds
        nothing but spaces (it would run the BOS alone), and BOS added when the model expects it (add_bos=None)."""
        if not check_prompt(text).strip():
            raise PromptError("the prompt is empty: give some text")
        return self.encode(text, self.add_bos if add_bos is None else add_bos)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        check_prompt(text, limit=float("inf"))  # no length bound here: corpora are encoded too
        if self._hf is not None:
            ids = self._hf.encode(text, add_special_tokens=False).ids
        elif self._special_re is None:
            ids = self._sp.encode(text)
        else:
            ids, pos = [], 0
            for m in self._special_re.finditer(text):
                if m.start() > pos:
                    ids += self._sp.encode(text[pos:m.start()])
                ids.append(self._special_by_text[m.group()])
                pos = m.end()
            if pos < len(text):
                ids += self._sp.encode(text[pos:])
        if add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        """The text of these ids; an id the tokenizer has no piece for reads as its placeholder, "[id=N]"."""
        ids = [int(i) for i in ids]
        # the runs between unknown ids are decoded separately (HF's tokenizers would drop such an id without a word),
        # and for sentencepiece, which renders control tokens as "", the runs between those too
        out, run = [], []
        for i in ids:
            if not self.knows(i) or (self._hf is None and i in self._special):
                if run:
                    out.append(self._decode_run(run))
                    run = []
                out.append(self._tokens[i] if self.knows(i) else unknown_piece(i))
            else:
                run.append(i)
        if run:
            out.append(self._decode_run(run))
        return "".join(out)

    def _decode_run(self, ids: list[int]) -> str:
        if self._hf is not None:
            return self._hf.decode(ids, skip_special_tokens=False)
        return self._sp.decode(ids)

    def knows(self, token_id: int) -> bool:
        """Whether the tokenizer has a piece for this id. A checkpoint's embedding may have more rows than its
        tokenizer has pieces (rows padded to a multiple of 64 or 128): the model can still rank those ids."""
        return 0 <= token_id < self.vocab_size

    # ------------------------------------------------------------------ per-token views

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_bytes(self, token_id: int) -> bytes:
        got = self._bytes.get(token_id)
        if got is None:
            got = self._bytes[token_id] = self._spelled_bytes(token_id)
        return got

    def _spelled_bytes(self, token_id: int) -> bytes:
        if not self.knows(token_id):
            return unknown_piece(token_id).encode("utf-8")
        tok = self._tokens[token_id]
        if token_id in self._special:
            return tok.encode("utf-8")
        if self._byte_level:
            if all(c in _UNICODE_TO_BYTE for c in tok):
                return bytes(_UNICODE_TO_BYTE[c] for c in tok)
            return tok.encode("utf-8")  # added tokens like "<think>" are stored as plain text
        m = BYTE_PIECE.fullmatch(tok)
        if m:
            return bytes([int(m.group(1), 16)])
        return tok.replace("\u2581", " ").encode("utf-8")

    def piece(self, token_id: int) -> str:
        if token_id in self._special:
            return self._tokens[token_id]
        # part of a UTF-8 character (common for CJK and emoji) shows its bytes (‹E9 80…›), not a bare "\ufffd"
        return readable(self.token_bytes(token_id))

    def __repr__(self):
        return (f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, "
                f"bos_id={self.bos_id}, eos_id={self.eos_id})")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_path(cls, folder) -> "Tokenizer":
        path = Path(folder)
        if path.is_file():  # also accept the file itself, dispatching on its name
            if path.suffix == ".json":
                return cls.from_tokenizer_json(path)
            if path.suffix == ".gguf":
                return cls.from_gguf(path)
            return cls.from_sentencepiece(path)
        if (path / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(path / "tokenizer.json")
        if (path / "tokenizer.model").is_file():
            return cls.from_sentencepiece(path / "tokenizer.model")
        raise TokenizerError(f"{path}: no tokenizer.json or tokenizer.model found")

    @classmethod
    def from_sentencepiece(cls, path) -> "Tokenizer":
        import sentencepiece as spm

        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read SentencePiece model ({one_line(e)})") from None
        if not data:  # sentencepiece would accept it and then log C++ errors on every call
            raise TokenizerError(f"{path}: the SentencePiece model file is empty")
        try:
            sp = spm.SentencePieceProcessor(model_proto=data)
        except Exception as e:
            raise TokenizerError(f"{path}: not a valid SentencePiece model ({one_line(e)})") from None
        n = sp.get_piece_size()
        if n == 0:
            raise TokenizerError(f"{path}: SentencePiece model has an empty vocabulary")
        tokens = [sp.id_to_piece(i) for i in range(n)]
        # user-defined pieces are already matched in text by sentencepiece itself; control and unk are not
        special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
        bos, eos = sp.bos_id(), sp.eos_id()
        return cls("sentencepiece", tokens, special, bos if bos >= 0 else None, eos if eos >= 0 else None,
                   sp=sp, add_bos=bos >= 0)

    @classmethod
    def from_tokenizer_json(cls, path) -> "Tokenizer":
        import tokenizers

        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
            hf = tokenizers.Tokenizer.from_str(text)
            hf.no_truncation()  # a saved max_length/padding would silently cut or pad prompts
            hf.no_padding()
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read tokenizer.json ({one_line(e)})") from None
        except Exception as e:  # truncated JSON, or JSON that is not a tokenizer
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({one_line(e)})") from None

        vocab = hf.get_vocab(with_added_tokens=True)
        tokens = [""] * max(hf.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
        for tok, i in vocab.items():
            tokens[i] = tok
        special = [t["id"] for t in spec.get("added_tokens") or [] if t.get("special")]
        byte_level = '"ByteLevel"' in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])

        # bos/eos live next to tokenizer.json, not in it
        def load(name):
            try:
                return json.loads((path.parent / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}

        tok_cfg, model_cfg = load("tokenizer_config.json"), load("config.json")

        def token_id(name):
            t = tok_cfg.get(f"{name}_token")
            if isinstance(t, dict):
                t = t.get("content")
            if isinstance(t, str) and t in vocab:
                return vocab[t]
            i = model_cfg.get(f"{name}_token_id")
            if isinstance(i, list):  # e.g. Llama-3.1 lists several eos ids; the first is the canonical one
                i = i[0] if i else None
            return i if isinstance(i, int) and 0 <= i < len(tokens) else None

        bos_id, eos_id = token_id("bos"), token_id("eos")
        add_bos = tok_cfg.get("add_bos_token")
        if add_bos is None:  # the post-processor template says it when the config doesn't
            add_bos = bos_id is not None and bos_id in hf.encode("", add_special_tokens=True).ids
        return cls("tokenizer.json", tokens, special, bos_id, eos_id, hf=hf, byte_level=byte_level,
                   add_bos=bool(add_bos))

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        import gguf

        try:
            reader = gguf.GGUFReader(path)
        except Exception as e:
            raise TokenizerError(f"{path}: not a readable GGUF file ({one_line(e)})") from None
        from .gguf_vocab import read_gguf_tokenizer_fields

        return cls.from_gguf_fields(read_gguf_tokenizer_fields(reader), source=str(path))

    @classmethod
    def from_gguf_fields(cls, fields: dict, source: str = "GGUF") -> "Tokenizer":
        from .gguf_vocab import gguf_bpe, gguf_spm

        tokens = fields.get("tokenizer.ggml.tokens")
        model = fields.get("tokenizer.ggml.model")
        if not tokens:
            raise TokenizerError(f"{source}: no tokenizer.ggml.tokens in metadata")
        tokens = list(tokens)
        n = len(tokens)
        types = fields.get("tokenizer.ggml.token_type")
        if types is not None and len(types) != n:
            raise TokenizerError(f"{source}: token_type has {len(types)} entries for {n} tokens")
        types = list(types) if types is not None else [NORMAL] * n

        def tid(key):
            i = fields.get(key)
            return int(i) if i is not None and 0 <= int(i) < n else None

        bos_id, eos_id = tid("tokenizer.ggml.bos_token_id"), tid("tokenizer.ggml.eos_token_id")
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        if model == "gpt2":
            special = [i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)]
            hf = gguf_bpe(fields, tokens, types, source)
            return cls("gguf-gpt2", tokens, special, bos_id, eos_id, hf=hf, byte_level=True,
                       add_bos=bool(add_bos))
        if model == "llama":
            sp, types = gguf_spm(fields, tokens, types, source)
            special = [i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)]
            return cls("gguf-llama", tokens, special, bos_id, eos_id, sp=sp,
                       add_bos=True if add_bos is None else bool(add_bos))
        raise TokenizerError(f"{source}: unsupported tokenizer.ggml.model {model!r} (expected 'gpt2' or 'llama')")


