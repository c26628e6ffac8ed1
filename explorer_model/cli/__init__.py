"""`llama-explorer`: inspect, tokenize, record and generate from the command line. Here: the parser, its checks of
every argument, and the entry point that turns every failure into one line; the commands are in commands.py.

Every problem with the input ends in one line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import warnings

from ..printable import printable
from .commands import (MIN_TEMPERATURE, CliError, cmd_classroom_check, cmd_generate, cmd_info,  # noqa: F401
                       cmd_record, cmd_serve, cmd_tokenize, cmd_train_tiny, one_line, prompt_ids)

SOURCE_HELP = "smollm2 (default), tiny-pre / tiny-post, a .gguf file, an HF folder (config.json) or a Meta folder (params.json)"
PROMPT_FILE_HELP = "the prompt read from FILE (- : standard input), UTF-8, its last newline dropped"
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # memory.DTYPE_CHOICES, without importing torch here
DTYPE_HELP = ("weights' dtype: auto (default: float32 if it fits comfortably, else the checkpoint's 16-bit type), "
              "float32, bfloat16 or float16; norms, softmax and logits are computed in float32 regardless")


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl+C, so temporaries are removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (no usage dump) and exit status 2, like every other error."""

    def error(self, message: str):
        self.exit(2, f"llama-explorer: error: {printable(message)} (see --help)\n")


class Once(argparse.Action):
    """An option that takes one value: given a second time it is refused (argparse would keep the last silently,
    and a run would quietly use another value than the one the person read first)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option_string} is given twice: give it once")
        setattr(namespace, self.dest, value)


def number(kind=int, low=None, high=None, what: str = ""):
    """An argparse type: a finite number of `kind` within [low, high] (NaN, inf, out of range: refused)."""
    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {what or 'a number'} {bounds}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def text_file(path: str) -> str:
    """An argparse type: the text of a file ("-": standard input), as a prompt: UTF-8 (a leading byte-order mark
    dropped), one trailing newline dropped (the one an editor ends a file with), at most the prompt's limit (the file
    is not read past it). For a prompt longer than a command line holds (Linux: 128 KB per argument)."""
    from ..tokenizer.frontend import MAX_PROMPT_CHARS

    most = 4 * MAX_PROMPT_CHARS + 1  # UTF-8 takes at most 4 bytes a character: more bytes are more characters
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(most)
        else:
            with open(path, "rb") as f:
                data = f.read(most)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {name}: {e.strerror or e}") from None
    if len(data) == most:
        raise argparse.ArgumentTypeError(f"{name} holds more than {MAX_PROMPT_CHARS:,} characters, the limit of a prompt")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise argparse.ArgumentTypeError(f"{name} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{name} holds no text")
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


PORT = number(int, 1, 65535, "a port number")
POSITIVE = number(int, 1, 10**9, "a whole number")


def _is_oom(e: BaseException) -> bool:
    """torch reports an allocation failure as a RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or ("memory" in text and ("alloc" in text or "out of" in text))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="llama-explorer", description="See what a LLaMA model does inside.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="config, parameter counts, KV-cache size")
    s.add_argument("source", nargs="?", default="smollm2", help=SOURCE_HELP)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_info)

    s = sub.add_parser("tokenize", help="ids and pieces of a text")
    s.add_argument("source", nargs="?", default="smollm2", help=SOURCE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--text-file", dest="text", metavar="FILE", type=text_file, help="the text read from FILE (- : standard input)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_tokenize)

    s = sub.add_parser("record", help="record hooked tensors to an .npz file")
    s.add_argument("source", nargs="?", default="smollm2", help=SOURCE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--prompt-file", dest="prompt", metavar="FILE", type=text_file, help=PROMPT_FILE_HELP)
    g.add_argument("--token-ids", help="comma-separated ids, e.g. 1,2,3")
    s.add_argument("--out", required=True)
    s.add_argument("--names", nargs="*", action="extend", help="hook-name globs, e.g. 'blocks.*.attn.hook_pattern' "
                   "(repeatable)")
    s.add_argument("--float16", action="store_true", help="store tensors in float16 (half the size)")
    s.add_argument("--progress", action="store_true", help="draw a per-layer progress bar on stderr "
                   "(default: when stderr is a terminal)")
    s.add_argument("--ablate", action="append", metavar="HEADS",
                   help="ablate heads for this run: blocks.3.attn.head5, blocks.3.attn.head2+5 or blocks.3.attn")
    s.add_argument("--intervene", action="append", metavar="SPEC",
                   help="any what-if form, e.g. no-mask, no-rope, skip:blocks.3.mlp, patch:blocks.5.hook_resid_pre@4; "
                        "repeatable, or several comma-separated as in the app's link")
    s.add_argument("--patch-source", metavar="TEXT", action=Once, help="source prompt for patch: interventions")
    s.set_defaults(fn=cmd_record)

    s = sub.add_parser("generate", help="continue a prompt (KV cache)")
    s.add_argument("source", nargs="?", default="smollm2", help=SOURCE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--prompt-file", dest="prompt", metavar="FILE", type=text_file, help=PROMPT_FILE_HELP)
    s.add_argument("--max-new-tokens", type=number(int, 0, 10**6, "a token count"), default=32)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    s.add_argument("--top-k", type=number(int, 0, 10**9, "a token count"), default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=number(int, 0, 2**64 - 1, "a seed"), default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--progress", action="store_true", help="draw the prompt's pass layer by layer, then the new "
                   "tokens, on stderr (default: when stderr is a terminal)")
    s.add_argument("--threads", type=number(int, 1, 256, "a thread count"), help="CPU threads for the prompt's pass and the torch decode step "
                   "(default 2 on a machine with 4 or more cores, else 1; the count can change the last bits of the "
                   "logits); the compiled decode step runs on one")
    s.set_defaults(fn=cmd_generate)

    # --- train-tiny ---
    s = sub.add_parser("train-tiny", help="train a tiny Pre-Norm or Post-Norm LLaMA on the shipped corpus")
    s.add_argument("--norm", choices=["pre", "post"], required=True)
    for flag, typ in (("layers", POSITIVE), ("d-model", POSITIVE), ("heads", POSITIVE), ("kv-heads", POSITIVE),
                      ("d-ff", POSITIVE), ("context", POSITIVE), ("batch", POSITIVE), ("steps", POSITIVE),
                      ("warmup", number(int, 0, 10**9, "a step count")), ("lr", number(float, 1e-12, 10.0, "a rate")),
                      ("seed", number(int, 0, 2**32 - 1, "a seed")), ("log-every", POSITIVE),
                      ("threads", number(int, 1, 256, "a thread count"))):
        s.add_argument(f"--{flag}", type=typ, help="default: see TrainConfig in explorer_model/lab/train.py")
    s.add_argument("--out", help="output folder (default assets/tiny-NORM)")
    s.add_argument("--tokenizer", help="SentencePiece model (default assets/tiny/tokenizer.model)")
    s.set_defaults(fn=cmd_train_tiny)
    # --- end train-tiny ---

    s = sub.add_parser("serve", help="start the explorer app in the browser")
    s.add_argument("source", nargs="?", default="smollm2", help=SOURCE_HELP)
    s.add_argument("--port", type=PORT, default=8501)
    s.add_argument("--share", action="store_true",
                   help="listen on the network for a classroom; visitors pick from a list of models, never a path")
    s.add_argument("--models-dir", help="a folder whose models (.gguf files, model folders) are offered by name, "
                   "beside the built-in ones (a --share visitor can load no other)")
    s.add_argument("--max-tokens", type=number(int, 1, 10**6, "a token count"), help="longest prompt a visitor may run (default 512 shared, 2048 local)")
    s.add_argument("--cache-mb", type=number(int, 1, 10**8, "a size in MB"), help="memory for cached recordings (default 2048)")
    s.add_argument("--no-lab", action="store_true",
                   help="switch off the norm lab's training races and gradient probes (computed results still show)")
    s.add_argument("--lecture", metavar="FILE", help="open this lecture file (docs/lectures.md) for every visitor")
    s.add_argument("--processes", type=number(int, 1, 64, "a process count"), default=1,
                   help="app server processes behind HAProxy on --port (each its own model and cache; needs haproxy)")
    s.set_defaults(fn=cmd_serve)

    from .classroom_check import default_lang

    s = sub.add_parser("classroom-check", help="will this machine hold a class? a one-minute run with simulated "
                                               "students on a private server, answered in one paragraph")
    s.add_argument("--students", type=int, default=30, help="simulated students (default 30)")
    s.add_argument("--pace", type=float, default=10.0, help="mean seconds between one student's actions (default 10)")
    s.add_argument("--duration", type=float, default=60.0, help="seconds the students keep typing prompts (default 60)")
    s.add_argument("--model", default=None, help="the model the students visit (default: the page's, smollm2)")
    s.add_argument("--lang", choices=("en", "zh"), default=default_lang(), help="language of the answer "
                                                                               "(default: from LANG)")
    s.add_argument("--json", action="store_true", help="print the whole report as JSON (the answer included)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.set_defaults(fn=cmd_classroom_check)
    for name in ("info", "record", "generate", "serve"):  # (tokenize reads no weights)
        sub.choices[name].add_argument("--dtype", choices=DTYPE_CHOICES, default=None, help=DTYPE_HELP)
    p.commands = tuple(sub.choices)
    return p


def _command_after_options(given: list, commands) -> str | None:
    """The command of `--prompt hi record …` or `smollm2 info`: options or a model written before it (argparse
    would read "hi" or "smollm2" as the command)."""
    if given and isinstance(given[0], str) and given[0] not in (*commands, "-h", "--help"):
        return next((a for a in given[1:] if a in commands), None)
    return None


def main(argv: list[str] | None = None) -> int:
    # torch's unpickler warns about pickle protocols on the way to refusing a file; the user needs
    # our one line, not its internals.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    parser = build_parser()
    given = sys.argv[1:] if argv is None else list(argv)
    if command := _command_after_options(given, parser.commands):
        return _fail(f"the command comes first, then its options: llama-explorer {command} {given[0]} … (see --help)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a refused argument (2, one line) or --help (0): a status, as for every command
        return e.code if isinstance(e.code, int) else 2
    from ..runtime import keep_freed_memory

    keep_freed_memory()
    # Our own warnings (e.g. an unwritable weight cache) are one line each, like the errors.
    formatwarning = warnings.formatwarning
    warnings.formatwarning = lambda message, *_a, **_k: f"llama-explorer: warning: {printable(one_line(Warning(message)))}\n"
    try:
        return _run(args)
    finally:
        warnings.formatwarning = formatwarning


def _run(args) -> int:
    stopped: list[int] = []

    def stop(signum, _frame):
        stopped.append(signum)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        status = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BaseException as e:
        # After SIGTERM or SIGHUP, what the signal's default action would report, once the cleanups ran. The
        # signal can land inside a library's own cleanup (zipfile closing a member), which then raises its own
        # error in place of Stopped; the signal is still why the command ended.
        if stopped:
            return 128 + stopped[0]
        return _failure_status(e)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status if isinstance(status, int) else 0


def _failure_status(e: BaseException) -> int:
    """The exit status for an exception that ended a command, with its one line on stderr."""
    from ..config import ConfigError  # (these modules import no torch: a wrong path is answered at once)
    from ..export_path import ExportError
    from ..loaders.errors import LoadError
    from ..tokenizer import PromptError, TokenizerError

    if isinstance(e, CliError):
        for line in [one_line(e), *(one_line(CliError(m)) for m in e.more)]:  # a lecture's mistakes: one line each
            status = _fail(line)
        return status
    if isinstance(e, (LoadError, ConfigError, TokenizerError, PromptError, ExportError)):
        return _fail(one_line(e))
    if isinstance(e, KeyboardInterrupt):
        return 130
    if isinstance(e, BrokenPipeError):  # `llama-explorer tokenize ... | head -1`
        # stdout is gone: point it at /dev/null so the interpreter's final flush does not complain again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _fail("the output was closed before everything was written (broken pipe)")
    if isinstance(e, (MemoryError, RuntimeError)) and _is_oom(e):
        return _fail("out of memory; try a shorter prompt, fewer hooks (--names) or a smaller model")
    if isinstance(e, Exception):  # a case nobody foresaw: still one line (LLAMA_EXPLORER_DEBUG=1: the traceback)
        return _unexpected(e)
    raise e  # SystemExit and the like keep their meaning


def _fail(message: str) -> int:
    # backslashreplace: a path or prompt with bytes that are not UTF-8 is shown escaped, never a second error
    line = f"llama-explorer: error: {printable(message)}".encode("utf-8", "backslashreplace").decode("utf-8")
    print(line, file=sys.stderr)
    return 2


def _unexpected(e: Exception) -> int:
    if os.environ.get("LLAMA_EXPLORER_DEBUG"):
        raise e
    return _fail(f"{type(e).__name__}: {one_line(e)} (set LLAMA_EXPLORER_DEBUG=1 for the traceback)")

