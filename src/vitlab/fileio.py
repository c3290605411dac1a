"""Where vitlab writes, and writing files so that nothing half-written is ever left behind.

Output locations are checked before any work starts (`check_out_folder`, `check_out_file`): a path
that names a file where a folder is expected, a folder that cannot be created or written (a write
probe, not a guess from permission bits), a non-empty folder holding something other than this kind
of vitlab output, an existing file an export would replace. Each is one VitlabError naming the path;
`force=True` (the commands' `--force`) is the one way to write into a folder of someone else's files
or over an existing file. A folder vitlab creates gets a small marker file, `.vitlab`, naming the
kind of output it holds ("run", "demo", ...), so the same command may write there again, and
`output_folder` removes the folders it created if the work fails before writing anything.

Every file vitlab writes goes to a temporary name in the same folder and is moved into place with
`os.replace`, which is atomic on POSIX and Windows: a reader (or a resumed run) sees the old file or
the new one, never a torn one; a folder written as a whole (`temporary_folder`) likewise. Files and
folders get the permissions an ordinary `open(path, "w")` or `mkdir` would give (the user's umask). A
write that fails (a full disk, a read-only file system) is one VitlabError naming the file. Temporary
names carry `TMP_TAG`, so the leftovers of a killed process are recognised, and the next successful
write of the same name removes them.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import glob
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from vitlab.errors import VitlabError

MARKER = ".vitlab"  # in a folder vitlab made: {"kind": "run" | "demo" | ...}, the kind of output it holds
TMP_TAG = ".vitlab-tmp-"  # in the name of everything written under a temporary name: .NAME.vitlab-tmp-PID-XXXXXXXX


def cache_root() -> Path:
    """The one folder vitlab writes to outside a command's `--out`: $VITLAB_CACHE, else the platform's cache
    folder ($XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab; on macOS ~/Library/Caches/vitlab, on Windows
    %LOCALAPPDATA%\\vitlab). Below it: datasets/ (Fashion-MNIST's checked copies), tuning/ (`vitlab tune`'s
    measurements), inductor/ (torch.compile's kernels). Nothing is created here: a writer creates its folder."""
    if os.environ.get("VITLAB_CACHE"):
        return Path(os.environ["VITLAB_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "vitlab"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "vitlab"
    home = Path.home()  # the only place vitlab reaches into the home folder
    return home / ("Library/Caches" if sys.platform == "darwin" else ".cache") / "vitlab"


# The files of the libraries vitlab uses, kept under the cache root: each variable names the folder a library
# writes to, and each library reads it once (on import, or its first compile), so the command line sets them before
# it imports any of them (`contain_library_caches`). A variable the user has set is left as it is.
LIBRARY_CACHES = {
    "MPLCONFIGDIR": "matplotlib",  # matplotlib's config folder and font cache (else under the home folder)
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # torch.compile's kernels (else in the system's temporary folder)
    "TRITON_CACHE_DIR": "triton",  # torch.compile's GPU kernels
    "GRADIO_TEMP_DIR": "gradio",  # the files `vitlab serve`'s page hands the browser
}
# What cannot be moved is turned off: inductor keeps its precompiled C++ headers in the system's temporary folder
# whatever TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/codecache.py); without them a compile takes a little longer.
LIBRARY_SETTINGS = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def contain_library_caches() -> None:
    """Point the libraries' own files under the cache root (LIBRARY_CACHES); for the command line, before it
    imports them."""
    root = cache_root()
    for variable, folder in LIBRARY_CACHES.items():
        os.environ.setdefault(variable, str(root / folder))
    for variable, value in LIBRARY_SETTINGS.items():
        os.environ.setdefault(variable, value)


def import_onnxruntime():
    """ONNX Runtime, imported with its telemetry files under the cache root, and its telemetry events off. When it
    is imported it writes a device id and an event database under $XDG_CACHE_HOME/Microsoft (else under the home
    folder) and a session file in $TMPDIR; both variables point into the cache root while it is imported. Raises
    ImportError where it is not installed."""
    folder = cache_root() / "onnxruntime"
    folder.mkdir(parents=True, exist_ok=True)
    saved = {variable: os.environ.get(variable) for variable in ("XDG_CACHE_HOME", "TMPDIR")}
    os.environ.update(XDG_CACHE_HOME=str(folder), TMPDIR=str(folder))
    try:
        import onnxruntime
    finally:
        for variable, value in saved.items():
            if value is None:
                del os.environ[variable]
            else:
                os.environ[variable] = value
    onnxruntime.disable_telemetry_events()
    return onnxruntime


FILE_MODE, FOLDER_MODE = 0o666, 0o777  # what open(path, "w") and mkdir ask for; the umask takes its bits away


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------------------------------
# Output locations, checked before any work


def _why(e: BaseException) -> str:
    """The reason a file operation failed, in words (safetensors and torch report errno in their text)."""
    code = getattr(e, "errno", None)
    if code is None:
        found = re.search(r"(?:code: |errno |Errno )(\d+)", str(e))
        code = int(found.group(1)) if found else None
    words = {
        errno.ENOSPC: "no space left on the disk",
        errno.EDQUOT: "the disk quota is used up",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENOENT: "the folder does not exist or does not accept new files",
        errno.ENOTDIR: "a part of the path is a file, not a folder",
    }
    if code in words:
        return words[code]
    text = getattr(e, "strerror", None) or (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def write_error(path: str | Path, e: BaseException) -> VitlabError:
    """A failed write as one line that names the file and the reason (a full disk, a read-only folder).
    A library that gives no errno (torch's zip writer) is read as a full disk when the disk is full."""
    why = _why(e)
    if why.startswith(type(e).__name__) and _free_bytes(Path(path)) < 2**16:
        why = "no space left on the disk"
    return VitlabError(f"could not write {path}: {why}")


def _free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 2**62


def out_kind(folder: Path) -> str | None:
    """The kind of vitlab output `folder` holds, from its marker (None: not a folder vitlab made)."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def _probe(folder: Path) -> None:
    """Create and remove a file in `folder`: the one reliable test that it can be written."""
    fd, tmp = tempfile.mkstemp(prefix=".vitlab-probe.", dir=folder)
    os.close(fd)
    os.unlink(tmp)


def _check_writable(folder: Path, path: Path, arg: str) -> None:
    """`path` will be written in `folder` (which may not exist yet): the nearest existing one of `folder`
    and its parents must be a folder vitlab can create files in."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise VitlabError(f"{arg} {path} cannot be created: {existing} is a file, not a folder", arg=arg)
    try:
        _probe(existing)
    except OSError as e:
        raise VitlabError(
            f"{arg} {path} cannot be {'written' if existing == folder else 'created'}: cannot write in "
            f"{existing}: {_why(e)}; choose another place",
            arg=arg,
        ) from e


def check_out_folder(path: str | Path, *, kind: str | None, force: bool = False, arg: str = "out") -> Path:
    """Check an output folder before any work; create nothing. Returns it (`~` expanded).

    kind: the kind of vitlab output it will hold ("run", "demo", "reproduce", ...): a non-empty folder
        is accepted when vitlab made it for this kind (its marker says so), or with `force`. None: the
        folder must be new or empty, whatever `force` says (its content would be replaced as a whole).
    A file in its place, or a folder that cannot be created or written, is refused in any case.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise VitlabError(f"{arg} {path} is a file; expected a folder (it is created if missing)", arg=arg)
    _check_writable(path, path, arg)
    if not path.exists():
        return path
    entries = sorted(p.name for p in path.iterdir() if p.name != MARKER)
    if not entries:
        return path
    if kind is None:
        raise VitlabError(f"{arg} {path} already exists and is not empty; choose a new folder or delete it", arg=arg)
    found = out_kind(path)
    if found == kind or force:
        return path
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    holds = f"the output of another vitlab command ({found})" if found else f"files vitlab did not write ({shown})"
    raise VitlabError(
        f"{arg} {path} already holds {holds}; choose a new folder, or pass force=True to write into it "
        "(files of the same names are replaced)",
        arg=arg,
        also=("force",),
    )


def check_out_file(path: str | Path, *, force: bool = False, companions: Sequence[Path] = (), arg: str = "out") -> Path:
    """Check an output file (and the files written next to it) before any work; create nothing.

    An existing file is replaced only with `force`; a folder in its place, or a folder that cannot be
    created or written, is refused in any case. Returns the path (`~` expanded)."""
    path = Path(path).expanduser()
    for p in (path, *companions):
        if p.is_dir():
            raise VitlabError(
                f"{arg} {p} is a folder; expected a file name such as {p / ('model' + path.suffix)}", arg=arg
            )
    existing = [str(p) for p in (path, *companions) if p.exists()]
    if existing and not force:
        raise VitlabError(
            f"{arg} {' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; choose "
            "another name, or pass force=True to replace",
            arg=arg,
            also=("force",),
        )
    _check_writable(path.parent, path, arg)
    return path


@contextlib.contextmanager
def created_folders(folder: str | Path) -> Iterator[Path]:
    """Make `folder` and its missing parents; if the block fails, remove those of them left empty."""
    folder = Path(folder).expanduser()
    made = []
    p = folder
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise VitlabError(f"could not create {folder}: {_why(e)}") from e
    try:
        yield folder
    except BaseException:
        for p in made:  # deepest first
            with contextlib.suppress(OSError):
                p.rmdir()  # only if empty
        raise


@contextlib.contextmanager
def output_folder(path: str | Path, *, kind: str, force: bool = False, arg: str = "out") -> Iterator[Path]:
    """An output folder for the block: checked (`check_out_folder`), created with its marker, and left
    as it was (the marker gone, a new folder removed) if the block fails before writing anything in it."""
    path = check_out_folder(path, kind=kind, force=force, arg=arg)
    with created_folders(path):
        marked = out_kind(path) != kind
        mark_folder(path, kind)
        try:
            yield path
        except BaseException:
            if marked and [p.name for p in path.iterdir()] == [MARKER]:
                (path / MARKER).unlink()
            raise


@contextlib.contextmanager
def whole_folder(path: str | Path, *, kind: str, arg: str = "out") -> Iterator[Path]:
    """A folder written as a whole (a dataset): the block fills a temporary folder next to `path`, which
    then takes `path`'s place in one move. `path` must be new, empty, or this kind's own earlier output,
    which is replaced whole, so that nothing of the old one mixes with the new (an image left over from
    another split would sit in both train/ and val/). A folder of anything else is refused; if the block
    fails, `path` is left as it was."""
    path = Path(path).expanduser()
    again = path.is_dir() and out_kind(path) == kind
    path = check_out_folder(path, kind=kind if again else None, arg=arg)
    with created_folders(path.parent):  # parents made for it are removed again if the block fails
        try:
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=tmp_prefix(path)))
            os.chmod(tmp, FOLDER_MODE & ~umask())  # mkdtemp makes 0700; give the folder ordinary permissions
        except OSError as e:
            raise write_error(path, e) from e
        old = None
        try:
            yield tmp
            (tmp / MARKER).write_text(json.dumps({"kind": kind}) + "\n")  # in the temporary folder: need not be atomic
            if path.is_dir() and any(path.iterdir()):  # this kind's earlier output (or its marker alone)
                old = Path(tempfile.mkdtemp(dir=path.parent, prefix=tmp_prefix(path) + "old-"))
                os.replace(path, old)  # onto an empty folder: one move
            os.replace(tmp, path)  # an empty `path` folder is replaced too
        except BaseException as e:
            if old is not None and not path.exists():
                os.replace(old, path)  # the earlier output back in place
                old = None
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):  # a full disk: one line, and nothing left behind
                raise write_error(path, e) from e
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    remove_leftovers(path)  # what a killed earlier write left next to it


def mark_folder(folder: str | Path, kind: str) -> None:
    """Mark `folder` (created if missing) as holding vitlab output of this kind."""
    folder = Path(folder)
    if out_kind(folder) != kind:
        write_json(folder / MARKER, {"kind": kind})


# ----------------------------------------------------------------------------------------------------
# Atomic writes


def tmp_prefix(path: str | Path) -> str:
    """The start of a temporary name for `path`: its name, the tag, and the writing process's id."""
    return f".{Path(path).name}{TMP_TAG}{os.getpid()}-"


def _writer_alive(name: str, stem: str) -> bool:
    """Whether the process that made the temporary `name` (`stem` + PID-...) still runs: its write may be in
    progress."""
    pid = name[len(stem) :].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def ordinary_permissions(path: str | Path) -> None:
    """The permissions `open(path, "w")` would give a file (0666 less the umask): for files a library creates
    private."""
    os.chmod(path, FILE_MODE & ~umask())


def remove_leftovers(path: str | Path) -> None:
    """Remove what a killed write of `path` left next to it: `.NAME.vitlab-tmp-PID-*` files and folders whose
    process no longer runs (another process's write in progress is left alone)."""
    path = Path(path)
    stem = f".{path.name}{TMP_TAG}"
    with contextlib.suppress(OSError):
        for p in path.parent.glob(glob.escape(stem) + "*"):
            if _writer_alive(p.name, stem):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary path next to `path`, then move the result into place. A write
    that fails for want of space or permission is a VitlabError naming `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(path), dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise write_error(path, e) from e
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE & ~umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise write_error(path, e) from e
        raise
    remove_leftovers(path)
    return path


@contextlib.contextmanager
def temporary_folder(path: str | Path) -> Iterator[Path]:
    """A new folder under a temporary name next to `path`, with ordinary permissions; the block fills it,
    and it then replaces `path` as a whole (an existing `path` is removed first). If the block fails,
    the temporary folder is removed and `path` is left as it was; a failed write (a full disk) is a
    VitlabError naming `path`."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(path), dir=path.parent))
        os.chmod(tmp, FOLDER_MODE & ~umask())  # mkdtemp makes 0700; give the folder ordinary permissions
        yield tmp
        if path.is_dir() and not path.is_symlink() and any(path.iterdir()):
            shutil.rmtree(path)
        os.replace(tmp, path)  # an empty `path` folder is replaced too
    except OSError as e:
        raise write_error(path, e) from e
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    remove_leftovers(path)


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
