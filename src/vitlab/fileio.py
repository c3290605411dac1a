"""Writing files so that nothing half-written is ever left behind.

Every file vitlab writes goes to a temporary name in the same folder and is moved into place with
`os.replace`, which is atomic on POSIX and Windows: a reader (or a resumed run) sees the old file or
the new one, never a torn one. Files get the permissions an ordinary `open(path, "w")` would give.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary path next to `path`, then move the result into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: str | Path, obj, indent: int = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def write_csv(path: str | Path, rows: Sequence[dict] | Iterable[Sequence], header: Sequence[str] | None = None) -> Path:
    """Rows as dicts (the header is the first row's keys) or as sequences under `header`."""
    rows = list(rows)
    buf = io.StringIO()
    if header is None:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    else:
        writer = csv.writer(buf)
        writer.writerow(header)
        writer.writerows(rows)
    return write_text(path, buf.getvalue())
