"""`ppsim`: the command line, one module per command (`ppsim X` in sim/cli/X.py).

This package is the top layer (ARCHITECTURE.md): it parses flags, loads plug-ins, calls the
studies, outputs and engine below it, and turns every error into one line on stderr with exit
code 2 (a bug: exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys

from sim.core.errors import PipeSimError

EPILOG_MAIN = """examples:
  ppsim run experiments/configs/default.toml --out runs/default
  ppsim report runs/default
  ppsim goodput experiments/configs/tp4.toml --jobs 2
  ppsim plan --model qwen2.5-32b --gpus 4 --workload azure-conv-synth
  ppsim reproduce fig9 --quick
  ppsim list
Every command's --help lists its own examples. Errors are one line and exit with code 2.
"""

# `ppsim X` lives in sim/cli/X.py, whose add_commands(sub) adds its sub-parser(s); in help order.
# NOTE: importing sim.cli.list binds the name `list` in this module's globals, so the builtin
# list() is not used here.
COMMANDS = ("run", "list", "workload", "profile", "reproduce", "goodput", "validate", "report", "plan",
            "fidelity", "compare", "gate")

# Commands that take --plugin FILE_OR_MODULE (repeatable) and --debug.
SIMULATING_COMMANDS = ("run", "list", "goodput", "reproduce", "plan", "gate", "validate", "fidelity")


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (`ppsim ...: error: ...; see --help`), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _one_line(exc: BaseException) -> str:
    # Ray re-raises a worker's error as RayTaskError(OriginalType), whose text is a traceback.
    cause = getattr(exc, "cause", None)
    text = str(cause if isinstance(cause, PipeSimError) else exc).strip()
    # the first line at a newline only: a carriage return or form feed inside a value the message
    # quotes (e.g. --set latency.profile="\r") is not a line break (the caller folds all whitespace)
    return text.split("\n")[0] if text else type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ppsim", description="PipeSim: simulate TP and pipeline-parallel LLM serving.",
        epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import importlib

    for name in COMMANDS:
        importlib.import_module(f"sim.cli.{name}").add_commands(sub)
    from sim.cli.common import add_arguments

    for name in SIMULATING_COMMANDS:
        add_arguments(sub.choices[name])
    return parser


def _flag_of(args, filename: str) -> str:
    """'--out ' when `filename` is the --out folder or inside it (the flag to blame), else ''."""
    for key, value in vars(args).items():
        if isinstance(value, str) and value and key not in ("command", "func"):
            base = value.rstrip("/") or "/"
            if filename == value or filename == base or filename.startswith(base + "/"):
                return f"--{key.replace('_', '-')} " if key != "config" else "config "
    return ""


class PipeGuard:
    """stdout that survives its reader leaving (`ppsim goodput ... | head -1`): the first
    BrokenPipeError points the descriptor at /dev/null and later writes are dropped, so the
    command finishes and writes its files; `main` then exits 141 (128 + SIGPIPE), as `cat` does."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.broken = False

    def _gone(self) -> None:
        self.broken = True
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.inner.fileno())
        except (OSError, ValueError, AttributeError):
            pass  # not a file descriptor (e.g. captured by a test): nothing flushes it at exit

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.inner.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.inner.flush()
            except BrokenPipeError:
                self._gone()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a timeout, systemd, Slurm, Kubernetes, a closed terminal), raised as an
    interrupt so that it unwinds as Ctrl-C does: staging folders, temporary files and spills are
    removed on the way out, sweep workers stopped (their own handler removes their spills)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, _frame):
    raise Terminated(signum)


# the catchable signals that end a command; each becomes Terminated (SIGINT: KeyboardInterrupt)
ENDING_SIGNALS = ("SIGTERM", "SIGHUP")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed a one-line usage error
        return int(exc.code or 0)
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    ending = [getattr(signal, n) for n in ("SIGINT", *ENDING_SIGNALS) if hasattr(signal, n)]
    before = {sig: signal.getsignal(sig) for sig in ending} if main_thread else {}
    for sig in ending[1:] if main_thread else ():
        if before[sig] is not signal.SIG_IGN:  # (nohup's SIGHUP stays ignored)
            signal.signal(sig, _terminate)
    guard = sys.stdout = PipeGuard(sys.stdout)
    try:
        return _dispatch(parser, args, guard)
    finally:
        from sim.core.fsio import release_locks

        release_locks()  # the command's --out folders (sim/core/fsio.py lock_out)
        if sys.stdout is guard:
            sys.stdout = guard.inner
        for sig, handler in before.items():
            if handler is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                # (a test calling main in-process keeps its handlers; after a signal, the ending
                # signals stay ignored while the process ends, so that none interrupts the clean-up)
                signal.signal(sig, handler)


def _dispatch(parser, args, guard: PipeGuard) -> int:
    import signal

    try:
        if hasattr(args, "plugin"):
            import sim.policies  # noqa: F401  (creates the plug-in kinds' registries before loading)
            from sim.core.plugins import load_all, normalize

            args.plugin = [normalize(p) for p in args.plugin]
            load_all(args.plugin)
        code = int(args.func(args) or 0)
        guard.flush()  # inside the try: a reader that left shows up here, not at exit
        return 141 if guard.broken else code
    except PipeSimError as exc:
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        from sim.core.config import attribute_to_override

        msg = attribute_to_override(_one_line(exc), getattr(args, "set", None) or [])
        print(f"ppsim: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # Handled once: a second Ctrl-C (or SIGTERM) while this one is being handled is ignored, not
        # a traceback. The clean-up ran on the way here (every `finally` and `with` of the command).
        for name in ("SIGINT", *ENDING_SIGNALS):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        if isinstance(exc, Terminated):
            name = signal.Signals(exc.signum).name
            print(f"ppsim: terminated by {name}", file=sys.stderr)
            return 128 + exc.signum
        print("ppsim: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # nothing of PipeSim's exits mid-command: user code did (a plug-in)
        print(f"ppsim: error: code outside PipeSim called sys.exit({exc.code!r}) during the command "
              f"(a plug-in?); no outputs were completed", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a write that bypassed the guard (e.g. a progress bar's)
        guard._gone()
        return 141
    except OSError as exc:
        from sim.core.fsio import NO_ROOM, disk_full

        if exc.errno in NO_ROOM and not os.environ.get("PPSIM_DEBUG"):
            # a write no writer named (e.g. inside a library): the file if the error says, else the
            # folder the command writes into, else $TMPDIR (spills)
            import tempfile

            where = exc.filename or getattr(args, "out", None) or tempfile.gettempdir()
            print(f"ppsim: error: {' '.join(str(disk_full(where, exc)).split())}", file=sys.stderr)
            return 2
        if exc.filename is None or os.environ.get("PPSIM_DEBUG"):
            return _internal_error(exc)
        msg = f"{_flag_of(args, str(exc.filename))}{exc.filename}: {exc.strerror or exc}"
        print(f"ppsim: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: one line, exit 1
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """A bug: one line naming the exception and where it was raised, exit 1;
    PPSIM_DEBUG=1 re-raises it for the traceback."""
    if os.environ.get("PPSIM_DEBUG"):
        raise exc
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    print(f"ppsim: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}{where} "
          f"(a bug; rerun with PPSIM_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1

