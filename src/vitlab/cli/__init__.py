"""`vitlab`: a thin command line over the library (the parser and `main` are in `vitlab.cli.commands`).

`main(argv)` is importable (`from vitlab.cli import main`) and returns the exit code. This module itself
imports nothing heavy: `run()`, the console script, loads the command line inside its own guard, and a
command's `run` imports the library (torch: seconds) inside `main`'s, so Ctrl-C while vitlab starts is one
line, `error: interrupted`, like Ctrl-C at any later moment, not a traceback through the imports.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING

from vitlab.fileio import contain_library_caches

if TYPE_CHECKING:  # for readers and tools; at run time loaded on first use (below)
    from vitlab.cli.commands import COMMANDS, build_parser, main

_COMMANDS_MODULE = "vitlab.cli.commands"
_NAMES = ("main", "build_parser", "COMMANDS")


def __getattr__(name: str):
    """`main`, `build_parser`, `COMMANDS`: from vitlab.cli.commands, loaded on first use (PEP 562)."""
    if name in _NAMES:
        return getattr(importlib.import_module(_COMMANDS_MODULE), name)
    raise AttributeError(f"module 'vitlab.cli' has no attribute {name!r}")


def run() -> None:  # pragma: no cover - the console script
    contain_library_caches()  # before matplotlib and torch are imported
    # torch's C++ builder logs "No CUDA runtime is found" at each CPU compile, a timestamped line of no use here
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        main = importlib.import_module(_COMMANDS_MODULE).main
    except KeyboardInterrupt:
        print("error: interrupted while vitlab was starting", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())


__all__ = ["main", "build_parser", "COMMANDS", "run"]
