"""How vitlab's help reads: the formatters and the example every command's --help ends with. Imports nothing
heavy, so that `vitlab --help` answers without loading torch."""

from __future__ import annotations

import argparse


class Formatter(argparse.HelpFormatter):
    """argparse's help, with a text that has indented lines (a list of commands, an example) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n  " in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def example(command: str) -> str:
    """The epilog every command's --help ends with: one command line to copy."""
    return f"example:\n  {command}"


class DefaultsFormatter(Formatter):
    """Help that ends with the default, where there is one worth showing."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        d = action.default
        if d is None or isinstance(d, bool) or d is argparse.SUPPRESS or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"
