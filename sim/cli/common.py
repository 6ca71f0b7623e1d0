"""Flags shared by several commands."""

from __future__ import annotations


def add_arguments(parser) -> None:
    """--plugin and --debug, on every command that runs simulations."""
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="load chunk policies / rebalancers from a .py file or an importable module "
                             "(repeatable; see sim/policies/API.md)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
