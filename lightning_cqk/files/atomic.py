"""Writing files so that a reader never sees half of one: the package's one home for atomic writes (standard library).

Every writer of the package goes through here: run records and summaries, budgets, manifests, sweep status and
results (`write_json_atomically`, `write_text_atomically`), checkpoints folders (`replace_folder`, `link_folder`),
and the folder fsyncs after a rename (`fsync_path`). The pattern is always the same: write the whole content under
a hidden temporary name beside the target (an unpredictable name, created exclusively: no other writer, process
or thread, uses it, and a file or symlink planted there is never written through), then rename it over the
target, atomic on POSIX: a reader sees the old version or the new one, concurrent writers leave one whole version, and
a crash or a full disk leaves the old file and at most a hidden `.<name>.<pid>...tmp` leftover. `durable=True` also
fsyncs the file before the rename and the folder after it, so the new version survives a power loss.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any


def write_text_atomically(path: str | Path, text: str, *, durable: bool = False) -> Path:
    """Write `text` to `path` whole or not at all, UTF-8 (module docstring). Creates the folder."""
    return write_bytes_atomically(path, text.encode("utf-8"), durable=durable)


def write_bytes_atomically(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Write `data` to `path` whole or not at all (module docstring). Creates the folder.

    The temporary file is created exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`) under an unpredictable name
    (`secrets`), so a file or symlink planted beside the target, at any name, is never opened, written through or
    put in place: a name that exists is skipped for a fresh one. A symlink at `path` itself is replaced, not followed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_exclusively(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_path(path.parent)
    return path


def _create_exclusively(path: Path) -> tuple[int, Path]:
    """Open a new hidden `.<name>.<pid>.<random>.tmp` beside `path` that no one else created: (descriptor, path).
    The file's mode is 0o666 less the umask, like any file the package writes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a fresh temporary file beside {path} in 100 tries")


def write_json_atomically(
    path: str | Path,
    data: Any,
    *,
    sort_keys: bool = False,
    default: Any = None,
    ensure_ascii: bool = True,
    durable: bool = False,
) -> Path:
    """Write `data` as indented JSON so that a reader never sees half a file: the one JSON writer of the package.

    Through `write_text_atomically` (module docstring); `durable` fsyncs the file and its folder. Creates the folder.
    """
    text = json.dumps(data, indent=2, sort_keys=sort_keys, default=default, ensure_ascii=ensure_ascii) + "\n"
    return write_text_atomically(path, text, durable=durable)


def fsync_path(path: str | Path) -> None:
    """Flush a file's content, or a folder's entries (a rename inside it), to disk; a no-op where it cannot be opened
    (a folder on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_path(path: str | Path) -> None:
    """Remove a checkpoint file, link or folder (missing: nothing to do)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace_folder(source: str | Path, target: str | Path) -> None:
    """Put the folder `source` (written completely under a temporary name beside `target`) at `target`.

    A folder cannot be renamed over a non-empty one, so whatever is at `target` is first renamed aside (to a hidden
    `.<name>.old.<pid>.tmp`, which `RunCheckpoint` removes at the next start if this process dies before it does),
    then `source` is renamed to `target`, then the old one is removed. A reader sees the old checkpoint, the new one,
    or (between the two renames) none at that name, never half of one: a resume then takes the newest intact
    periodic checkpoint instead (`run_dir.resumable_checkpoint`).
    """
    source, target = Path(source), Path(target)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old.{os.getpid()}.tmp")
        remove_path(old)
        os.rename(target, old)
    os.rename(source, target)
    fsync_path(target.parent)
    if old is not None:
        remove_path(old)


def link_folder(source: str | Path, target: str | Path) -> None:
    """Make `target` a folder of hard links to the files of folder `source` (no byte copied), built under a temporary
    name and put in place by `replace_folder`. Raises OSError where hard links are impossible."""
    source, target = Path(source), Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    remove_path(tmp)
    try:
        for root, _, files in os.walk(source):
            here = tmp / Path(root).relative_to(source)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                os.link(Path(root) / name, here / name)
        replace_folder(tmp, target)
    finally:
        remove_path(tmp)
