"""The command line's parser and `main(argv)` (re-exported as `vitlab.cli.main`).

Each command lives in its own module of this package, with `register(subparsers, summary)` adding its
parser and a `run(args)` function that calls the library; the flags several commands share are declared
once (`_common`). `main(argv)` returns the exit code: 0 for success, 2 for a user mistake (printed as
one line `error: ...`, with a library argument's name written as the flag it came from), 130 for
Ctrl-C (one line); tracebacks only for bugs. A warning is one line `warning: ...` too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from vitlab import __version__
from vitlab.cli._help import Formatter, example
from vitlab.errors import VitlabError

# The commands, in the order `vitlab --help` lists them: the order a newcomer meets them (the demo, then the
# README's quick start, then the rest), each with its one line there. Each lives in the module of its name in this
# package (`vitlab.cli.<name>`: `register(subparsers, summary)` and the `run` it points at, its EXAMPLE the last line
# of its help), loaded only when its command is run or the whole parser is built: `vitlab --help` loads none, and
# `vitlab NAME --help` no torch (a command's module imports the library inside `run`).
COMMANDS = {
    "demo": "the paper's mini experiment: position embedding on and off",
    "data": "write the digits or Fashion-MNIST as an image folder; scan a folder",
    "train": "train a ViT or the CNN baseline from random weights",
    "predict": "the top-k classes of images, with the weights' own preprocessing",
    "attention": "draw where a ViT attends: class-token attention or rollout",
    "finetune": "fine-tune a model on your image folder, head first",
    "export": "write a model: .safetensors, .onnx, a timm or HF folder (checked)",
    "serve": "a local web page: top-5, attention, Figure 7, your runs",
    "info": "what a model costs: parameters, FLOPs, training memory",
    "inspect": "the paper's Figure 7 and the token norms of a model",
    "reproduce": "test the paper's claims at laptop scale; write a report",
    "bench": "speed and memory next to timm, compiled timm and ONNX Runtime",
    "tune": "measure a model's fastest path here, for --fast-path tuned",
}


def command_module(name: str):
    """The module of command `name`: its parser's module, which imports the library (and torch) only in `run`."""
    return importlib.import_module(f"vitlab.cli.{name}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line `error: ...` (exit 2), not a usage dump; help kept as written
    where it is a list or an example."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise VitlabError(f"{self.prog}: {message}")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `argv`, of the command it names only (the others listed by name, their
    modules not loaded), so that a command starts without importing the other twelve, and `vitlab --help` with
    none."""
    width = max(len(name) for name in COMMANDS) + 2
    listing = "\n".join(f"  {name:<{width}}{summary}" for name, summary in COMMANDS.items())
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
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, summary in COMMANDS.items():
        if argv is None or name == named:
            command_module(name).register(sub, summary)
        else:
            sub.add_parser(name, help=summary, add_help=False)  # a name to choose; `vitlab NAME` loads its module
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command line says everything: one line, no source line of vitlab's or a library's."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():  # restored after: main() called from Python leaves warnings as they were
        warnings.showwarning = _one_line_warning
        args = None
        try:
            argv = sys.argv[1:] if argv is None else argv
            parser = build_parser(argv)
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
