"""A run directory belongs to one live process: `<run dir>/.lock`, held with an OS file lock for the process's life.

`lightning_cqk fit` takes the lock as soon as it knows the run directory, before any model, data or logger is built
(`lightning_cqk/run/directory.py` decides which directory), so a second `fit` aimed at a directory in use stops at
once with a message naming the live process, instead of interleaving logs and checkpoints with it. The sweep runner
takes the same kind of lock on a sweep directory (`.sweep.lock`), and probes a run's lock (`holder`) before it deletes
anything.

How (atomic by construction): the lock file is opened (created if missing) and locked with a POSIX record lock
(`fcntl.lockf(LOCK_EX | LOCK_NB)`). The kernel grants it to exactly one process and releases it when that process
dies, however it dies (SIGKILL included), so "stale" needs no guessing: a lock nobody holds is free, and of several
processes racing for a fresh or a stale lock exactly one wins. After winning, the holder checks that the file it
locked is still the one at the path (a releasing holder unlinks it) and then writes its pid, host, process start time
and command into it, for the messages of the others only: liveness is decided by the kernel lock, never by the
file's contents, so a reader that sees the file half-written does not mistake it for stale. POSIX locks (unlike
`flock`) are not inherited by forked children (DataLoader workers), so an orphaned worker cannot keep a dead run's
lock; they are per process, so the holder never opens and closes the lock file a second time (that would drop it).

Two cases the kernel lock cannot decide are refused as before: a lock file written by a process on another host
(a shared file system may not carry locks between hosts: delete it by hand if that run is dead), and a lock file
naming a live process on this host that does not hold the kernel lock (an older version of this package).
The lock file is removed when the process exits normally (atexit); a SIGKILL leaves the file, unlocked, behind.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LOCK_NAME = ".lock"
_HELD: dict[Path, RunLock] = {}


class RunDirectoryInUse(RuntimeError):
    """The directory is locked by a process that is still running (or by another host)."""


@dataclass
class LockOwner:
    """Who holds a run directory."""

    pid: int
    host: str
    start: str | None  # the process start time (/proc/<pid>/stat field 22), None where unknown
    since: float  # time.time() when the lock was taken
    argv: list[str]

    @staticmethod
    def me() -> LockOwner:
        return LockOwner(os.getpid(), socket.gethostname(), process_start(os.getpid()), time.time(), list(sys.argv))

    def alive(self) -> bool | None:
        """True/False for a process on this host; None when it runs on another host (cannot be checked)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        if process_state(self.pid) in ("Z", "X"):
            return False  # exited, not yet reaped by its parent (e.g. a SIGKILLed run whose runner died too)
        start = process_start(self.pid)
        return self.start is None or start is None or start == self.start

    def is_me(self) -> bool:
        return self.pid == os.getpid() and self.host == socket.gethostname()

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = " ".join(self.argv)[:200]
        return f"pid {self.pid} on host {self.host}, since {when}, command: {command}"


def process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (Linux), None elsewhere or when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22; the command name in () may contain spaces


def process_state(pid: int) -> str | None:
    """A process's state letter (Linux `/proc/<pid>/stat` field 3: R, S, D, Z zombie, X dead, ...), None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def _parse(raw: bytes) -> LockOwner | None:
    """The owner recorded in a lock file's bytes; None when empty or unreadable."""
    try:
        data = json.loads(raw.decode())
        return LockOwner(
            int(data["pid"]), str(data["host"]), data.get("start"), float(data["since"]), list(data["argv"])
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@dataclass
class RunLock:
    """A held lock; `release()` (also at exit) removes the file and drops the kernel lock."""

    path: Path
    owner: LockOwner
    fd: int

    def release(self) -> None:
        if self.fd < 0 or os.getpid() != self.owner.pid:  # a forked child never releases its parent's lock
            return
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink(missing_ok=True)  # while still locked: a waiting taker re-checks the path
        finally:
            os.close(self.fd)  # drops the POSIX lock
            self.fd = -1
            _HELD.pop(self.path, None)


def _key(path: Path) -> Path:
    return path.parent.resolve() / path.name


def _in_use_message(folder: Path, owner: LockOwner | None, what: str) -> str:
    if owner is None:
        return (
            f"{what} {folder} is locked by another process that is starting right now (it has not written its name "
            "yet). Wait for it, or start this run in another directory."
        )
    return (
        f"{what} {folder} is in use by a live run ({owner.describe()}). Two processes must not write into one "
        f"run. Wait for it to finish or stop it (kill {owner.pid}) and resume with --ckpt_path last; or start a "
        "separate run (drop --ckpt_path for a fresh directory, or set --trainer.logger.init_args.version)."
    )


def _other_host_message(folder: Path, path: Path, owner: LockOwner, what: str) -> str:
    return (
        f"{what} {folder} is locked by a run on another host ({owner.describe()}). If that run is finished or "
        f"dead, delete {path} and start again; otherwise wait for it, or start this run in another directory (drop "
        "--ckpt_path for a fresh one, or set --trainer.logger.init_args.version)."
    )


def acquire(run_dir: str | Path, log=print, wait: float = 2.0, name: str = LOCK_NAME, what: str = "Run directory"):
    """Lock `run_dir` for this process (creating the folder), taking over an unheld (stale) lock; re-entrant.

    Args:
        run_dir: the directory to own.
        log: where the take-over message goes.
        wait: seconds to keep trying while the holder is only just starting (its name not yet written).
        name: the lock file's name inside the directory.
        what: how messages call the directory.

    Raises:
        RunDirectoryInUse: a live process (or one on another host) holds it; the message says how to proceed.
    """
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    key = _key(path)
    if key in _HELD and _HELD[key].fd >= 0:
        return _HELD[key]
    me = LockOwner.me()
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            owner = _parse(_read_fd(fd))
            os.close(fd)  # held no lock through this descriptor: closing it changes nothing
            if (owner is None or owner.alive() is False) and time.monotonic() < deadline:
                time.sleep(0.02)  # the new holder is writing its name (or a probe holds it for an instant)
                continue
            raise RunDirectoryInUse(_in_use_message(folder, owner, what))
        if not _same_file(fd, path):  # the holder we waited for removed it on release: lock the new file
            os.close(fd)
            continue
        raw = _read_fd(fd)
        previous = _parse(raw)
        if previous is not None and not previous.is_me():
            alive = previous.alive()
            if alive is None:
                os.close(fd)
                raise RunDirectoryInUse(_other_host_message(folder, path, previous, what))
            if alive:  # a live process that does not hold the kernel lock: an older version's lock file
                os.close(fd)
                raise RunDirectoryInUse(_in_use_message(folder, previous, what))
            log(f"run lock: took over {path} from a run that is no longer running ({previous.describe()}).")
        elif previous is None and raw.strip():
            log(f"run lock: took over {path} (an unreadable lock file, left by a process that died writing it).")
        data = json.dumps(asdict(me)).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        break
    lock = RunLock(path, me, fd)
    _HELD[key] = lock
    atexit.register(lock.release)
    return lock


def holder(run_dir: str | Path, name: str = LOCK_NAME) -> LockOwner | None:
    """The live process holding `run_dir`'s lock (this process included), or None when nobody holds it.

    A lock file naming a process on another host counts as held (it cannot be checked from here).
    """
    path = Path(run_dir) / name
    key = _key(path) if path.parent.exists() else path
    if key in _HELD and _HELD[key].fd >= 0:
        return _HELD[key].owner
    try:
        fd = os.open(path, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not _try_lock(fd):
            return _parse(_read_fd(fd)) or LockOwner(-1, "?", None, time.time(), ["(starting)"])
        owner = _parse(_read_fd(fd))  # nobody holds the kernel lock: only the cases acquire refuses count
        if owner is not None and not owner.is_me() and owner.alive() is not False:
            return owner
        return None
    finally:
        os.close(fd)  # drops the probe's lock, if it took one
