"""MkDocs hook: the command-line reference, generated from vitlab's argparse parsers at build time.

docs/cli.md holds the line `<!-- cli-reference -->`; this hook replaces it with what `vitlab --help` and
`vitlab COMMAND --help` print (and `vitlab data WHAT --help` for data's own commands), one section per
command in the order `vitlab --help` lists them. The page is the parsers' own text, so it cannot drift from
the command line; tests/test_docs.py builds the site and checks it against `--help`.
"""

from __future__ import annotations

import argparse
import os

from vitlab.cli import COMMANDS, build_parser

MARKER = "<!-- cli-reference -->"
WIDTH = 80  # the help as a terminal of 80 columns prints it (argparse reads $COLUMNS)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-commands by name (argparse keeps them on its one sub-parsers action)."""
    for action in parser._actions:  # argparse has no public accessor for these
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        return parser.format_help().rstrip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _section(title: str, summary: str, parser: argparse.ArgumentParser, level: int) -> str:
    return f"{'#' * level} `{title}`\n\n{summary}\n\n```text\n{_help(parser)}\n```\n"


def reference() -> str:
    """The generated part of docs/cli.md, as Markdown."""
    top = build_parser()
    commands = _commands(top)
    parts = [f"## `vitlab`\n\n```text\n{_help(top)}\n```\n"]
    for name, summary in COMMANDS.items():
        parts.append(_section(f"vitlab {name}", summary, commands[name], 2))
        for sub, parser in _commands(commands[name]).items():
            parts.append(_section(f"vitlab {name} {sub}", parser.description or "", parser, 3))
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # MkDocs' hook
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
