"""`vitlab`: a thin command line over the library.

Each command lives in its own module of this package, with `register(subparsers)` adding its parser
and a `run(args)` function that calls the library; the flags several commands share are declared
once (`_common`). `main(argv)` is importable and returns the exit code: 0 for success, 2 for a user
mistake (printed as one line `error: ...`, with a library argument's name written as its flag),
tracebacks only for bugs.
"""

from __future__ import annotations

import argparse
import sys

from vitlab import __version__
from vitlab.cli import (attention, bench, data, demo, export, finetune, info, inspect, predict, reproduce, serve, train,
                        tune)
from vitlab.errors import VitlabError

# The commands, in the order `vitlab --help` lists them.
COMMANDS = [demo, info, attention, inspect, predict, export, serve, data, train, finetune, reproduce, bench, tune]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line `error: ...` (exit 2), not a usage dump."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise VitlabError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vitlab", description="The Vision Transformer paper, runnable.")
    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except VitlabError as e:
        print(f"error: {e.for_cli()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def run() -> None:  # pragma: no cover - the console script
    sys.exit(main())
