"""The commands of `llama-explorer` (info, tokenize, record, generate, train-tiny, serve, classroom-check), each a
function of its parsed arguments; the parser and the one-line error handling are in __init__.py. A problem with
the input is a CliError (or a loader's, tokenizer's or exporter's own error), which the caller prints as one line.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

from ..printable import padded, printable, printable_json
from ..tokenizer import check_ids
from ..tokenizer.labels import fragment_labels

MIN_TEMPERATURE = 1e-3  # below this sampling is greedy in all but name, and tiny values overflow the logits


class CliError(Exception):
    """A refusal the command explains on stderr: one line, or one line for each of `more` after the first (a
    lecture file's mistakes, each on its own line as docs/lectures.md says)."""

    def __init__(self, message: str, *more: str):
        super().__init__(message)
        self.more = more


def one_line(e: BaseException) -> str:
    from ..loaders.errors import one_line as first_line

    return first_line(e, limit=500)  # room for a long path and what is wrong with it


def _load(source: str, dtype: str | None = None):
    from ..loaders import load

    return load(source, dtype=dtype)


def prompt_ids(cfg, tokenizer, text: str | None, token_ids: str | None, flag: str = "--prompt",
               context: bool = True) -> list[int]:
    """Token ids from --prompt (or the command's `flag`) or --token-ids, checked against the vocabulary of `cfg`
    and, where the model will run them (`context`), against its context length."""
    if token_ids is not None:
        try:
            # "1 2" and "1,,2" refused, not read as 12 or skipped; nothing at all is "no tokens" (check_ids)
            ids = [int(x) for x in token_ids.split(",")] if token_ids.replace(",", "").strip() else []
        except ValueError:
            raise CliError(f"--token-ids must be comma-separated integers, got {token_ids!r}") from None
    else:
        if text is None or not text.strip():
            raise CliError(f"the prompt is empty: give some text with {flag}")
        ids = tokenizer.encode_prompt(text)  # refuses over MAX_PROMPT_CHARS before tokenizing
    return check_ids(ids, cfg.vocab_size, cfg.max_seq_len if context else None)


def memory_lines(cfg) -> list[str]:
    """What each dtype needs, and what this machine has, before anything is loaded."""
    from ..memory import DEFAULT_TOKENS, available_bytes, estimates, size_text

    room, n = available_bytes(), min(DEFAULT_TOKENS, cfg.max_seq_len)  # a model's context may be shorter
    lines = [f"memory to run {n} tokens (available: {size_text(room) if room is not None else 'unknown'}):"]
    for name, est in estimates(cfg, n).items():
        lines.append(f"  {name:<16} {size_text(est.total):>9}  (weights {size_text(est.weights)} + runtime "
                     f"{size_text(est.runtime)})")
    return lines


def cmd_info(args) -> None:
    from ..loaders import LoadError, check_weights, read_tokenizer

    if not args.json:  # before loading: a model too big for this machine is refused below
        try:  # the config, the tokenizer and the weights' files found: a source the load refuses prints nothing on stdout
            cfg = read_tokenizer(args.source)[0]
            check_weights(args.source)
            print("\n".join(memory_lines(cfg)), flush=True)
        except LoadError:
            pass  # the load below says what is wrong with the source, in the loaders' own words
    t0 = time.perf_counter()
    loaded = _load(args.source, args.dtype)
    seconds = time.perf_counter() - t0
    from ..memory import DEFAULT_TOKENS, estimates, kv_cache_bytes_per_token

    model, cfg = loaded.model, loaded.model.cfg
    info = {
        "source": loaded.source,
        "description": loaded.description,
        "format": loaded.format,
        "dtype": loaded.dtype_name,
        "load_seconds": round(seconds, 2),
        "memory_bytes": {k: {"weights": e.weights, "runtime": e.runtime, "total": e.total, "n_tokens": e.n_tokens}
                         for k, e in estimates(loaded.cfg, min(DEFAULT_TOKENS, loaded.cfg.max_seq_len)).items()},
        "config": cfg.to_dict(),
        "parameters": model.param_counts(),
        "kv_cache_bytes_per_token_fp32": kv_cache_bytes_per_token(cfg, 4),
        "kv_cache_bytes_per_token_fp16": kv_cache_bytes_per_token(cfg, 2),
        "tokenizer": getattr(loaded.tokenizer, "kind", type(loaded.tokenizer).__name__),
        "decode_step": _decode_step(loaded.model),
    }
    if args.json:
        print(printable_json(info, indent=2, default=str))
        return
    print(printable(f"{loaded.description}  [{loaded.format}, {loaded.dtype_name}]  loaded in {seconds:.2f} s"))
    for k, v in info["config"].items():
        print(printable(f"  {k:<16} {v}"))
    print("parameters:")
    for k, v in info["parameters"].items():
        print(f"  {k:<16} {v:>12,}")
    print(f"KV cache per token: {info['kv_cache_bytes_per_token_fp32']:,} bytes (fp32), "
          f"{info['kv_cache_bytes_per_token_fp16']:,} bytes (fp16)")
    print(printable(f"decode step: {info['decode_step']}"))


def _decode_step(model) -> str:
    """Which step `generate` takes after the prompt (explorer_model/generate/native_step.py); builds it on first use."""
    from ..generate import native_build, native_step

    if not native_build.enabled():
        return "torch (LLAMA_EXPLORER_NATIVE=0)"
    if native_build.library() is None:
        return f"torch (no compiled step: {native_build.failure()})"
    if native_step.serves(model):
        return "compiled (native_step.c)"
    return "torch (the compiled step serves float32 pre-norm RMSNorm SwiGLU models)"


def cmd_tokenize(args) -> None:
    from ..loaders import read_tokenizer

    cfg, tok = read_tokenizer(args.source)  # no weights: a text's tokens need only the tokenizer
    ids = prompt_ids(cfg, tok, args.text, None, "--text", context=False)  # a text longer than the context counts too
    # a piece of a character split over several tokens is named as the app names it (深·1/3), not by its bytes
    names = fragment_labels([tok.token_bytes(i) for i in ids])
    rows = [{"id": i, "label": tok.piece(i) if tok.is_special(i) else name, "bytes": tok.token_bytes(i).hex(" ")}
            for i, name in zip(ids, names)]
    if args.json:
        print(printable_json({"ids": ids, "pieces": [r["label"] for r in rows], "bytes": [r["bytes"] for r in rows]}))
        return
    for r in rows:
        print(f"{r['id']:>8}  {padded(repr(r['label']), 25)}{r['bytes']}")


def cmd_record(args) -> None:
    from ..export_path import check_target

    target = check_target(args.out)  # before loading anything: a folder or a device is refused at once
    loaded = _load(args.source, args.dtype)
    import torch

    from ..export import about, check_fits, plan, save_npz, size_text
    from ..interventions import format_list
    from ..memory import layer_progress, text_progress
    from ..recording import checked_selection, record

    ids = prompt_ids(loaded.model.cfg, loaded.tokenizer, args.prompt, args.token_ids)
    names = args.names or None
    try:  # before anything runs, as record() checks it; a model named after --names is read as one more pattern
        checked_selection(loaded.model, names, None)
    except ValueError as e:
        model_like = [n for n in names or () if n in ("smollm2", "tiny-pre", "tiny-post") or os.path.exists(n)]
        raise CliError(f"--{e}" + ("; the model goes before --names" if model_like else "")) from None
    dtype = torch.float16 if args.float16 else torch.float32
    ivs, source_ids = what_if(loaded, args, len(ids))
    size = plan(loaded.model, ids, names, dtype)
    check_fits(size, target)
    print(printable(f"recording {len(ids)} token{'s' if len(ids) != 1 else ''}: {target} will take "
                    f"{size_text(size.file_bytes)}"), flush=True)
    bar = args.progress or sys.stderr.isatty()
    try:
        with layer_progress(loaded.model, text_progress("recording")) if bar else contextlib.nullcontext():
            rec = record(loaded.model, ids, names=names, dtype=dtype, interventions=ivs, source_tokens=source_ids)
    except ValueError as e:  # e.g. a patch position beyond one of the prompts
        raise CliError(str(e)) from None
    text = args.prompt if args.token_ids is None else None  # (the file names what it recorded: export.about)
    try:
        written = save_npz(rec, target, about(rec, loaded.model.cfg.name, text, ivs or (),
                                              source=where(loaded.source), patch_source=args.patch_source))
    except OSError as e:  # disk full, file-size limit, permissions: the previous file is left as it was
        raise CliError(f"cannot write {target}: {e.strerror or one_line(e)}") from None
    changed = f" with {format_list(ivs)}" if ivs else ""
    print(printable(f"recorded {len(rec)} tensors over {len(ids)} token{'s' if len(ids) != 1 else ''}{changed} "
                    f"to {written}"))


def where(source: str) -> str:
    """The model's path as the file keeps it: absolute, so that it still names the model once the file is moved
    (a path as typed, "hf1", is relative to where the command ran)."""
    return os.path.abspath(source) if os.path.exists(source) else source


def what_if(loaded, args, n_tokens: int):
    """Interventions from --ablate/--intervene (None if there are none) and the ids of --patch-source; a patch's
    position is checked in both prompts (the one recorded has n_tokens)."""
    from ..interventions import Patch, absolute_position, needs_source, parse

    # each --intervene one form, or several comma-separated as the app's link writes them
    specs = [f"ablate:{a}" for a in args.ablate or []]
    specs += [s for given in args.intervene or [] for s in given.split(",") if s.strip()]
    try:
        ivs = list({str(iv): iv for iv in map(parse, specs)}.values())  # one change given twice is made once
        for iv in ivs:
            iv.check(loaded.model)
    except ValueError as e:
        raise CliError(str(e)) from None
    if not needs_source(ivs):
        if args.patch_source is not None:  # a source nobody reads: the patch the person meant is missing
            raise CliError("--patch-source is the prompt a patch: intervention copies from, and none is given "
                           "(--intervene patch:blocks.L.hook_…@POS)")
        return ivs or None, None
    if args.patch_source is None:
        raise CliError("a patch: intervention needs --patch-source TEXT (the prompt to copy the activation from)")
    source = prompt_ids(loaded.model.cfg, loaded.tokenizer, args.patch_source, None, "--patch-source")
    try:  # before anything runs: a position one of the two prompts lacks
        for iv in ivs:
            if isinstance(iv, Patch):
                absolute_position(iv.pos, n_tokens)
                absolute_position(iv.pos, len(source), "source_position")
    except ValueError as e:
        raise CliError(str(e)) from None
    return ivs, source


def generation_bar(max_new: int, tokens: bool = True):
    """A layer_progress callback for generation, on stderr: the prompt's pass layer by layer (the long one on a
    big model), then one step per new token (each is a pass of one token through every layer) unless `tokens` is
    False (the text itself, printed as it grows on the same terminal, shows them)."""
    from ..memory import text_progress

    prompt, steps, passes = text_progress("prompt"), text_progress("tokens"), [0]

    def show(done: int, total: int) -> None:
        if passes[0] == 0:
            prompt(done, total)
        if done == total:
            passes[0] += 1
            if passes[0] > 1 and tokens:
                steps(passes[0] - 1, max_new)

    def finish() -> None:  # generation stopped before max_new passes (end of text): end the bar's line
        if tokens and 1 < passes[0] <= max_new:
            sys.stderr.write("\n")
    show.finish = finish
    return show


def text_stream(decode, write, before: str = ""):
    """An on_token callback that writes `before` (the prompt) and the new tokens' text as it grows, and `end()`, which
    writes the rest. `before` waits for the first token: on a terminal, the prompt's progress bar stands on that line
    until then. A character whose bytes are split over several tokens (SmolLM2's Chinese) decodes to U+FFFD until
    its last byte comes: it waits for it. The tokenizers here decode a sequence as the concatenation of its parts
    after the first, so what is written is `decode(ids)` whole."""
    ids, shown, waiting = [], [""], [before]

    def add(token: int) -> None:
        if waiting:
            write(waiting.pop())
        ids.append(token)
        ready = decode(ids).rstrip("\ufffd")
        if ready.startswith(shown[0]) and len(ready) > len(shown[0]):
            write(ready[len(shown[0]):])
            shown[0] = ready

    def end() -> None:
        if waiting:
            write(waiting.pop())
        text = decode(ids)
        write(text[len(shown[0]):] if text.startswith(shown[0]) else "")
    add.end = end
    return add


def cmd_generate(args) -> None:
    if not 0 < args.top_p <= 1:  # (`not 0 < p` refuses NaN too; --max-new-tokens and --top-k are parsed in range)
        raise CliError(f"--top-p must be above 0 and at most 1, got {args.top_p}")
    t = args.temperature
    if not (t == 0 or (math.isfinite(t) and t >= MIN_TEMPERATURE)):  # logits / 1e-320 overflow to inf, then NaN
        raise CliError(f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {t}")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise CliError(f"--seed must be between 0 and 2**64 - 1, got {args.seed}")
    if args.threads is not None and not 1 <= args.threads <= 256:
        raise CliError(f"--threads must be between 1 and 256, got {args.threads}")
    loaded = _load(args.source, args.dtype)
    ids = prompt_ids(loaded.model.cfg, loaded.tokenizer, args.prompt, None)
    eos = loaded.tokenizer.eos_id
    from ..generate.decode import pack_for_decode, packing_for
    from ..generate.sampling import generate
    from ..generate.native_step import serves
    from ..runtime import threads

    # this process owns its memory (see decode.py); same bits
    packing = packing_for(args.max_new_tokens, compiled=serves(loaded.model))
    if packing != "none":
        pack_for_decode(loaded.model, huge_pages=packing == "huge")
    # In this process only. A second thread makes a step ~1.3x faster when a core is free for it, and up to
    # twice slower when another process keeps that core busy (each of a step's ~150 parallel products waits
    # for it; bench/bench_decode.py --threads 1 vs 2 on this 2-core machine). So: two only with cores to spare.
    n_threads = args.threads or (2 if (os.cpu_count() or 1) >= 4 else 1)
    streamed = not args.json  # the text as it grows; JSON is one document, written at the end
    bar = (generation_bar(args.max_new_tokens, tokens=not (streamed and sys.stdout.isatty()))
           if args.progress or sys.stderr.isatty() else None)

    def write(text: str) -> None:  # the text's own lines and tabs stay; a terminal command from the prompt or the model does not
        sys.stdout.write(printable(text, keep="\n\t"))
        sys.stdout.flush()
    stream = text_stream(loaded.tokenizer.decode, write, args.prompt) if streamed else None
    new: list[int] = []

    def took(token: int) -> None:
        new.append(token)
        if stream:
            stream(token)
    try:
        with threads(n_threads):
            generate(loaded.model, ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                     stop_ids={eos} if eos is not None else None, progress=bar, on_token=took)
    except KeyboardInterrupt:  # Ctrl+C: what was generated is kept (exit status 130, as for any interrupted command)
        _generated(args, loaded, ids, new, stream, bar)
        print(f"stopped by Ctrl+C after {len(new)} new token{'s' if len(new) != 1 else ''}", file=sys.stderr)
        raise
    _generated(args, loaded, ids, new, stream, bar)
    if len(new) < args.max_new_tokens and (not new or new[-1] != eos) and \
            len(ids) + len(new) >= loaded.model.cfg.max_seq_len:
        print(f"stopped after {len(new)} new token{'s' if len(new) != 1 else ''}: the model's context ends at "
              f"{loaded.model.cfg.max_seq_len} tokens", file=sys.stderr)


def _generated(args, loaded, ids: list[int], new: list[int], stream, bar) -> None:
    """The end of generate's output: the streamed text's rest and its line's end, or the JSON document."""
    if bar:
        bar.finish()
    if stream:
        stream.end()
        print(flush=True)
    else:
        print(printable_json({"prompt_ids": ids, "new_ids": new, "text": loaded.tokenizer.decode(new)}), flush=True)


# --- train-tiny (the Pre-Norm / Post-Norm twins; see explorer_model/lab/train.py) ---
def cmd_train_tiny(args) -> None:
    from dataclasses import fields
    from pathlib import Path

    from ..lab.train import TrainConfig, train_tiny

    keys = {f.name for f in fields(TrainConfig)}
    tc = TrainConfig(**{k: v for k, v in vars(args).items() if k in keys and v is not None})
    from ..paths import ASSETS

    out = Path(args.out) if args.out else ASSETS / f"tiny-{tc.norm}"
    log = train_tiny(tc, out, **({"tokenizer_path": Path(args.tokenizer)} if args.tokenizer else {}))
    f = log["final"]
    print(printable(f"wrote {out}: train loss {f['train_loss']:.3f}, held-out {f['heldout_loss']:.3f} "
          f"(unigram entropy {log['unigram_entropy_train']:.3f}) in {log['seconds']:.0f} s"))
# --- end train-tiny ---


def warn_unopenable(folder: str) -> None:
    """A line on stderr for each entry of --models-dir a visitor could pick but not open (its config, tokenizer or
    weights missing or cut short), and each one left out of the list (it leads outside the folder): the teacher
    reads it before the lesson, not a student in it."""
    import warnings
    from pathlib import Path

    from ..loaders import LoadError, check_weights, folder_models, read_tokenizer

    root = Path(folder).resolve()
    for p in sorted(Path(folder).iterdir()):
        if not p.resolve().is_relative_to(root):
            warnings.warn(f"--models-dir: {p.name} is not offered: it leads outside the folder")
    for name, path in folder_models(folder).items():
        try:
            read_tokenizer(path)
            check_weights(path)
        except LoadError as e:
            warnings.warn(f"--models-dir: {name} is offered but will not open: {e}")


def cmd_serve(args) -> None:
    from .serve import haproxy_path, port_is_free, serve

    if args.models_dir and not os.path.isdir(args.models_dir):
        raise CliError(f"--models-dir {args.models_dir}: no such folder")
    if args.models_dir:
        warn_unopenable(args.models_dir)
    if args.source != "smollm2":  # a source that opens no model ends here, not in every visitor's page
        from ..loaders import SERVED_ENV, check_weights, read_tokenizer

        read_tokenizer(args.source)  # its config and tokenizer
        check_weights(args.source)
        os.environ[SERVED_ENV] = args.source  # the lecture's check below offers it, as the server will
    if args.dtype:  # the app's loads read it (memory.DTYPE_ENV); the server process inherits the environment
        from ..memory import DTYPE_ENV

        os.environ[DTYPE_ENV] = args.dtype
    if args.processes > 1 and haproxy_path() is None:
        raise CliError("--processes needs HAProxy (Debian: apt install haproxy)")
    if args.lecture:
        from .lecture_check import lecture_refusals

        if refusals := lecture_refusals(args.lecture, args.models_dir):
            raise CliError(*refusals)
    address = "0.0.0.0" if args.share else "127.0.0.1"
    try:  # before anything starts: a port another server holds, or one this user may not open
        port_is_free(address, args.port)
    except OSError as e:
        raise CliError(f"cannot listen on port {args.port}: {e.strerror or one_line(e)}") from None
    return serve(port=args.port, source=args.source, share=args.share, models_dir=args.models_dir,
                 max_tokens=args.max_tokens, cache_mb=args.cache_mb, lab=not args.no_lab, processes=args.processes,
                 lecture=args.lecture)


def cmd_classroom_check(args) -> None:
    from .classroom_check import answer, run_check

    for name in ("students", "pace", "duration"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name} {getattr(args, name)}: must be more than 0")
    report = run_check(students=args.students, pace=args.pace, duration=args.duration, model=args.model,
                       progress=not args.no_progress)
    report["answer"] = answer(report, args.lang)
    print(json.dumps(report, indent=1, ensure_ascii=False) if args.json else report["answer"])
