"""Rebuild a GGUF file's vocabulary (`tokenizer.ggml.*` metadata) into `tokenizers` or `sentencepiece`.

`gpt2` vocabularies become byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names; `llama`
vocabularies become a SentencePiece BPE ModelProto assembled from tokens, scores and types.
"""
import warnings

from .pieces import BYTE, BYTE_PIECE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, TokenizerError, one_line

# Pre-tokenizer regexes as llama.cpp names them in `tokenizer.ggml.pre`
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_PRES = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx"}
_GPT2_PRES = {None, "", "default", "gpt2", "gpt-2"}


def gguf_bpe(fields, tokens, types, source):
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merges = fields.get("tokenizer.ggml.merges")
    if not merges:
        raise TokenizerError(f"{source}: gpt2 tokenizer without tokenizer.ggml.merges")
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicate spelling can map to one id only; keep the first
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        pre = fields.get("tokenizer.ggml.pre")
        # Llama-3's tokenizer.json sets ignore_merges, and llama.cpp mirrors it for this pre type
        hf = HFTokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _LLAMA3_PRES, fuse_unk=False))
    except Exception as e:
        raise TokenizerError(f"{source}: invalid BPE vocab/merges ({one_line(e)})") from None

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if pre == "smollm":  # SmolLM2's tokenizer.json: every digit alone, then GPT-2's regex
        hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _LLAMA3_PRES:
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False), bytes_only])
    elif pre == "qwen2":
        hf.normalizer = normalizers.NFC()
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False), bytes_only])
    else:
        if pre not in _GPT2_PRES:
            warnings.warn(f"{source}: unknown tokenizer.ggml.pre {pre!r}; using GPT-2's pre-tokenizer", stacklevel=3)
        hf.pre_tokenizer = byte_level
    hf.decoder = decoders.ByteLevel()

    # added tokens keep their existing ids; without this "<|im_start|>" in text would be spelled out
    hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i, t in enumerate(types) if t == CONTROL and vocab[tokens[i]] == i])
    hf.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                   for i, t in enumerate(types) if t == USER_DEFINED and vocab[tokens[i]] == i])
    return hf


def gguf_spm(fields, tokens, types, source):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    n = len(tokens)
    scores = fields.get("tokenizer.ggml.scores")
    if scores is None:
        scores = [float(-i) for i in range(n)]  # no scores: assume the usual most-frequent-first order
    elif len(scores) != n:
        raise TokenizerError(f"{source}: scores has {len(scores)} entries for {n} tokens")
    types = [t if t in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE) else NORMAL for t in types]
    if fields.get("tokenizer.ggml.token_type") is None:  # untyped vocab: recover what matters
        types = [BYTE if BYTE_PIECE.fullmatch(t) else NORMAL for t in tokens]
        for key, ty in (("bos", CONTROL), ("eos", CONTROL)):
            i = fields.get(f"tokenizer.ggml.{key}_token_id")
            if i is not None and 0 <= int(i) < n:
                types[int(i)] = ty
    types = [NORMAL if t == BYTE and not BYTE_PIECE.fullmatch(tok) else t for t, tok in zip(types, tokens)]
    unk = fields.get("tokenizer.ggml.unknown_token_id")
    if unk is None and "<unk>" in tokens:
        unk = tokens.index("<unk>")
    if UNKNOWN not in types and unk is not None and 0 <= int(unk) < n:
        types[int(unk)] = UNKNOWN

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE  # llama.cpp's SPM tokenizer is score-driven BPE
    m.trainer_spec.byte_fallback = BYTE in types
    m.normalizer_spec.name = "identity"
    add_prefix = fields.get("tokenizer.ggml.add_space_prefix")
    m.normalizer_spec.add_dummy_prefix = True if add_prefix is None else bool(add_prefix)
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    seen = set()
    Piece = pb.ModelProto.SentencePiece
    for i, (tok, score, ty) in enumerate(zip(tokens, scores, types)):
        if not tok or tok in seen:  # sentencepiece rejects empty/duplicate pieces; park them unreachable
            tok, ty = f"<gguf-unreachable-{i}>", UNUSED
        seen.add(tok)
        m.pieces.append(Piece(piece=tok, score=float(score), type=ty))
    if UNKNOWN not in types:  # sentencepiece refuses a vocab without unk; with byte fallback it is never emitted
        m.pieces.append(Piece(piece="<unk>" if "<unk>" not in seen else "<gguf-unk>", score=0.0, type=UNKNOWN))
    try:
        sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    except Exception as e:
        raise TokenizerError(f"{source}: cannot build SentencePiece model from GGUF vocab ({one_line(e)})") from None
    return sp, types


_GGUF_KEYS = ("model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
              "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token", "add_space_prefix")


def read_gguf_tokenizer_fields(reader) -> dict:
    """Every `tokenizer.*` metadata field of a gguf.GGUFReader as plain Python values (missing ones None)."""
    from gguf import GGUFValueType

    out = {f"tokenizer.ggml.{k}": None for k in _GGUF_KEYS}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        try:
            out[name] = field.contents()
        except Exception:  # old gguf without contents(), or a token that is not valid UTF-8
            s = lambda part: bytes(part).decode("utf-8", errors="replace")  # noqa: E731
            if field.types[0] == GGUFValueType.ARRAY:
                if field.types[-1] == GGUFValueType.STRING:
                    out[name] = [s(field.parts[i]) for i in field.data]
                else:
                    out[name] = [v for i in field.data for v in field.parts[i].tolist()]
            elif field.types[0] == GGUFValueType.STRING:
                out[name] = s(field.parts[-1])
            else:
                out[name] = field.parts[-1].tolist()[0]
    return out
