"""The command line's parser and `main(argv)` (re-exported as `vitlab.cli.main`).

Each command lives in its own module of this package, with `register(subparsers)` adding its parser
and a `run(args)` function that calls the library; the flags several commands share are declared
once (`_common`). `main(argv)` returns the exit code: 0 for success, 2 for a user mistake (printed as
one line `error: ...`, with a library argument's name written as the flag it came from), 130 for
Ctrl-C (one line); tracebacks only for bugs. A warning is one line `warning: ...` too.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from vitlab import __version__
from vitlab.cli import (
    attention,
    bench,
    data,
    demo,
    export,
    finetune,
    info,
    inspect,
    predict,
    reproduce,
    serve,
    train,
    tune,
)
from vitlab.cli._common import Formatter, example
from vitlab.errors import VitlabError

# The commands, in the order `vitlab --help` lists them: the order a newcomer meets them (the demo, then the
# README's quick start, then the rest). Each module's HELP is its one line there, its EXAMPLE the last line of its help.
COMMANDS = [demo, data, train, predict, attention, finetune, export, serve, info, inspect, reproduce, bench, tune]


def command_name(module) -> str:
    return module.__name__.rsplit(".", 1)[1]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line `error: ...` (exit 2), not a usage dump; help kept as written
    where it is a list or an example."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise VitlabError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    width = max(len(command_name(m)) for m in COMMANDS) + 2
    listing = "\n".join(f"  {command_name(m):<{width}}{m.HELP}" for m in COMMANDS)
    parser = _Parser(
        prog="vitlab",
        usage="vitlab [-h] [--version] COMMAND ...",
        description="The Vision Transformer paper, runnable.\n\ncommands, in the order "
        f"a newcomer meets them (vitlab COMMAND --help says more):\n{listing}",
        epilog=example("vitlab demo"),
    )
    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, help=argparse.SUPPRESS, prog="vitlab"
    )
    for command in COMMANDS:
        command.register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command line says everything: one line, no source line of vitlab's or a library's."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():  # restored after: main() called from Python leaves warnings as they were
        warnings.showwarning = _one_line_warning
        args = None
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return 2
            return int(args.func(args) or 0)
        except VitlabError as e:
            print(f"error: {e.for_cli(getattr(args, 'flag_names', None))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
