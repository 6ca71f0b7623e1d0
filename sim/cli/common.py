"""Flags shared by several commands."""

from __future__ import annotations


def add_arguments(parser) -> None:
    """--plugin and --debug, on every command that runs simulations."""
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="load chunk policies / rebalancers from a .py file or an importable module "
                             "(repeatable; see sim/policies/API.md)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")


# ---------------------------------------------------------------- numeric flags
# argparse `type=` functions: a bad value is argparse's one-line usage error naming the flag and
# the allowed range (sim.core.checks, the same gate as config numbers), exit 2.

def _typed(parse, lo, hi, *, integer: bool, lo_open: bool = False):
    import argparse

    from sim.core.checks import describe_range, number
    from sim.core.errors import ConfigError

    def convert(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {describe_range(lo, hi, integer=integer, lo_open=lo_open)}")
        try:
            return number(value, "", "value", lo, hi, integer=integer, lo_open=lo_open)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value must be", "must be")) from None

    convert.__name__ = "integer" if integer else "number"
    return convert


def int_in(lo: int | None, hi: int | None):
    return _typed(int, lo, hi, integer=True)


def float_in(lo: float | None, hi: float | None, lo_open: bool = False):
    return _typed(float, lo, hi, integer=False, lo_open=lo_open)


SEEDS = int_in(1, 1000)
TOL = float_in(0, 10, lo_open=True)


def jobs(text: str) -> int:
    """--jobs N: at least 1; more than the machine's cores is capped at them, with a warning
    (more processes than cores only share the cores, each holding its own memory)."""
    import os

    n = int_in(1, 4096)(text)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > cores:
        warn(f"--jobs {n} capped at this machine's {cores} cores")
        return cores
    return n


def warn(text: str) -> None:
    """One warning line on stderr, as every command prints them."""
    import sys

    print(f"ppsim: warning: {text}", file=sys.stderr, flush=True)


def say_workload_changes(table, seed: int = 1) -> list[str]:
    """Print what the workload's reader changed of its input (rows or conversations skipped,
    dropped or cut: sim.workloads.build_workload_said), one warning line each, once before a
    study: its runs build the workload in worker processes, where nobody hears it."""
    from sim.workloads import build_workload_said

    _, changed = build_workload_said(table, seed=seed)
    for text in changed:
        warn(text)
    return changed
