"""A report folder that is never half old and half new: the whole report is written beside it, then swapped in.

`staged(out, owned)` yields an empty hidden folder beside `out` (`.<name>.new-<pid>`); the caller writes every file
of the report into it. When the caller returns, the folder gets `.report.json` (the names this report wrote) and
copies (hard links) of whatever else `out` held that no report wrote (a hand-written README.md beside a committed
report), and then replaces `out` in one step: `renameat2(RENAME_EXCHANGE)` on Linux, so `out` is at every moment
either the previous complete report or the new complete one. Where the exchange is not supported (other systems,
some file systems) it is two renames, `out` -> `.<name>.old-<pid>` then the new folder -> `out`: a kill between
them leaves no report at `out` for a moment, and the next report puts the old one back first. The previous report
is deleted only after the swap.

If the caller raises (a full disk, a file-size limit, a bug, Ctrl-C), the new folder is removed and `out` is left as
it was; a SIGKILL leaves only the hidden folder, removed by the next report. Which names of `out` belong to the
report: those listed in its `.report.json`; a report written before that record existed is recognised by `owned`
(the names a report writes); `out` holding anything else and no report at all is refused (NotAReportFolder), so
`--output .` never replaces a working directory.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_cqk.files.atomic import fsync_path

RECORD = ".report.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class NotAReportFolder(ValueError):
    """The report's destination holds files no report wrote; replacing it would delete them."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(out: Path, kind: str) -> list[tuple[Path, int]]:
    """Hidden folders `.<name>.<kind>-<pid>` beside `out` whose writer is gone."""
    found = []
    for path in out.parent.glob(f".{out.name}.{kind}-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            found.append((path, int(pid)))
    return found


def recover(out: Path) -> None:
    """Undo what a killed report left: put back a previous report moved aside by an interrupted two-rename swap,
    and remove unfinished new folders."""
    old = _leftovers(out, "old")
    if old and not out.exists():
        newest = max(old, key=lambda item: item[0].stat().st_mtime)[0]
        os.rename(newest, out)
        old = [item for item in old if item[0] != newest]
    for path, _ in [*old, *_leftovers(out, "new")]:
        shutil.rmtree(path, ignore_errors=True)


def owned_names(folder: Path, owned: Callable[[str], bool]) -> set[str] | None:
    """The names in `folder` that a report wrote (its record, else `owned`), or None when it holds no report."""
    record = folder / RECORD
    if record.is_file():
        try:
            return {str(n) for n in json.loads(record.read_text())["files"]} | {RECORD}
        except (ValueError, KeyError, TypeError):
            pass
    names = {p.name for p in folder.iterdir()}
    mine = {n for n in names if owned(n)}
    return mine if mine else None


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


def _carry(entry: Path, target: Path) -> None:
    """A file or folder that is not the report's, into the new folder (hard links: no second copy on disk)."""
    if entry.is_symlink():
        os.symlink(os.readlink(entry), target)
    elif entry.is_dir():
        shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(entry), str(target))


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _swap_in(new: Path, out: Path) -> None:
    if not out.exists():
        os.rename(new, out)
    elif exchange(new, out):
        shutil.rmtree(new, ignore_errors=True)  # now the previous report
    else:
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(new, out)
        shutil.rmtree(old, ignore_errors=True)
    fsync_path(out.parent)


@contextmanager
def staged(out: str | Path, owned: Callable[[str], bool]) -> Iterator[Path]:
    """Yield an empty folder beside `out` to write a whole report into; swap it in when the block succeeds (module
    docstring). `owned(name)`: whether a file of that name is one a report writes (for reports without a record).

    Raises:
        NotAReportFolder: `out` exists and holds something, but no report.
        OSError: from writing (the new folder is removed; `out` is unchanged).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)
    previous: set[str] = set()
    if out.exists():
        if not out.is_dir():
            raise NotAReportFolder(f"{out} is a file, not a report folder")
        names = {p.name for p in out.iterdir()}
        if names:
            mine = owned_names(out, owned)
            if mine is None:
                shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
                raise NotAReportFolder(f"{out} holds {shown} and no report")
            previous = mine
    new = out.with_name(f".{out.name}.new-{os.getpid()}")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir()
    try:
        yield new
        written = sorted(p.name for p in new.iterdir())
        for name in written:
            fsync_path(new / name)
        (new / RECORD).write_text(json.dumps({"files": written}, indent=1) + "\n")
        if out.exists():
            for entry in out.iterdir():
                if entry.name not in previous and entry.name not in written and entry.name != RECORD:
                    _carry(entry, new / entry.name)
        fsync_path(new)
        _swap_in(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
