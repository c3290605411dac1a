"""The one exception type for user mistakes, and the one way option ranges are checked.

A `VitlabError` message names the file or argument, what was expected and what was found, and, where
there is one, the fix. Library code speaks of its own arguments (`batch_size must be at least 1`); a
message about an argument carries that argument's name in `arg`, and the command line, which knows
the flag it came from, prints it as the flag (`--batch-size must be at least 1`); a message that
offers a switch as the fix (`pass force=True`) names it in `also`, and the command line shows the flag
(`pass --force`). The CLI prints any
VitlabError as a single line `error: ...` and exits with code 2; any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import math


class VitlabError(ValueError):
    """A user mistake: bad option, bad file, impossible sizes. Printed as one line by the CLI.

    `arg`: the library argument the message starts with (e.g. "batch_size"), when it is about one.
    `also`: boolean arguments the message offers as a fix, written `name=True` (e.g. "force").
    """

    def __init__(self, message: str, *, arg: str | None = None, also: tuple[str, ...] = ()):
        super().__init__(message)
        self.arg = arg
        self.also = also

    def for_cli(self, flags: dict[str, str] | None = None) -> str:
        """The message with its leading argument name written as the command-line flag
        (`batch_size` -> `--batch-size`, or the flag that `flags` maps it to)."""

        def flag(name: str) -> str:
            return (flags or {}).get(name, "--" + name.replace("_", "-"))

        text = str(self)
        for name in self.also:
            text = text.replace(f"{name}=True", flag(name))
        if self.arg and text.startswith(self.arg):
            return flag(self.arg) + text[len(self.arg) :]
        return text


def check_range(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    optional: bool = False,
    hint: str = "",
) -> None:
    """Raise a VitlabError unless `low <= value <= high` (open ends with `low_open`/`high_open`).

    The message says the valid range and what was found, in the argument's own name:
    "lr must be > 0; found -0.1", "val_split must be in (0, 1); found 1.5".
    """
    if value is None and optional:
        return
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high)
        )
    if ok:
        return
    kind = "an integer" if integer else "a number"
    show = lambda v: str(v) if isinstance(v, int) else f"{v:g}"  # noqa: E731 - 4294967295, not 4.29497e+09
    if low is not None and high is not None:
        expected = f"{kind} in {'(' if low_open else '['}{show(low)}, {show(high)}{')' if high_open else ']'}"
    elif low is not None:
        expected = f"{kind} {'>' if low_open else '>='} {show(low)}"
    elif high is not None:
        expected = f"{kind} {'<' if high_open else '<='} {show(high)}"
    else:
        expected = kind
    raise VitlabError(f"{name} must be {expected}; found {value!r}{hint}", arg=name)


__all__ = ["VitlabError", "check_range"]
