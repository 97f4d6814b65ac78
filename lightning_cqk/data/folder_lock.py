"""A data folder has an owner: one writer (``prepare``) or any number of readers (runs), never both at once.

``<data_dir>/.data.lock`` is locked with POSIX record locks (``fcntl.lockf``) for as long as the folder is used:

    prepare (writer)   an exclusive lock while it downloads, tokenizes and swaps the new build in. A second
                       ``prepare`` into the folder *waits* for the first (printing who holds it) and then reuses the
                       finished shards when they are what it asks for (even with ``overwrite``: a build that
                       finished after it was asked for is a fresh build); otherwise it rebuilds or refuses as a
                       prepare always does. So of two concurrent prepares (or of every node's local rank 0 of a
                       multi-node job preparing one shared ``data_dir``) exactly one builds and the others reuse.
    run (reader)       a shared lock from the DataModule's ``setup`` until ``teardown`` (or the process's end):
                       any number of runs read a folder together; a ``prepare`` that would rebuild it is refused
                       with a message naming each live run (pid, host, run directory, command) and what to do.
                       A run waits while a prepare builds the folder, then reads the finished build.

Each reader also writes ``<data_dir>/.readers/<host>-<pid>.json`` (pid, host, run directory, command) and holds an
exclusive lock on it: the kernel lock says whether that run is alive (a SIGKILLed run's record is unlocked, so it is
recognised as stale and removed), the file's text only names it in messages.

Why these locks: the kernel grants and releases them (a process that dies, however it dies, holds nothing), they
are not inherited by forked children (DataLoader and litdata workers never keep a dead run's lock), and they are
the locks network file systems carry between hosts: NFSv4, NFSv3 with lockd, Lustre mounted with ``-o flock``,
GPFS/Spectrum Scale, BeeGFS. **Limits**: where the file system does not carry POSIX locks between hosts (Lustre
``localflock`` or ``noflock``, most FUSE/object-store mounts such as s3fs, some NFS setups with ``nolock``) the lock
guards only the processes of one host; runs then still notice changed shards (``integrity.shard_fingerprint``:
checked at every validation, every checkpoint save and on resume) and refuse to go on. ``s3://`` data dirs are not
locked (their shards are uploaded manifest last; a run checks their manifest only). The locks are per process, so
one process holds one descriptor per folder (this module keeps it); a process that reads a folder cannot rebuild it.

**SIGTERM while waiting or building** (``ending_cleanly_on_sigterm``). Both waits (a run for a prepare, a prepare for
another) and ``prepare``'s build can last long, so that is where a SIGTERM (``kill``, ``timeout``, ``scancel``) tends
to arrive. Where it would kill the process at once (its disposition is the default), it instead raises
``Terminated`` (``SystemExit`` with status 143) in the main thread: the wait or build unwinds, so its lock is
released, a partial build removed, litdata's workers stopped, and ``atexit`` handlers run (``fit`` then removes the
run directory it created for a run that never started, which would otherwise make the next run ``-2``).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from lightning_cqk.environment import env_path
from lightning_cqk.errors import UserError

LOCK_NAME = ".data.lock"
READERS_DIR = ".readers"
RUN_DIR_ENV = "LIGHTNING_CQK_RUN_DIR"  # set by `lightning_cqk fit` (cli/trainer.py) for the processes of a run


class DataFolderInUse(UserError, RuntimeError):
    """A data folder that live runs read (or this process reads) cannot be rebuilt now; the message names them."""


class Terminated(SystemExit):
    """SIGTERM arrived inside ``ending_cleanly_on_sigterm``: the process ends with status 143 once cleanups ran."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise Terminated()


@contextmanager
def ending_cleanly_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises ``Terminated`` in the main thread instead of killing the process at once.

    Only where SIGTERM would kill the process (default disposition; a handler someone installed is left alone) and
    only in the main thread (the only one that receives Python signal handlers). Processes forked inside inherit it,
    so a worker that gets SIGTERM also runs its exit handlers. The previous disposition is restored on leaving.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class Holder:
    """Who holds a data folder: for messages only (liveness is the kernel lock's)."""

    pid: int
    host: str
    since: float
    argv: list[str]
    run_dir: str | None = None

    @staticmethod
    def me(run_dir: str | None = None) -> Holder:
        return Holder(os.getpid(), socket.gethostname(), time.time(), list(sys.argv), run_dir)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        run = f"run directory {self.run_dir}, " if self.run_dir else ""
        return f"pid {self.pid} on host {self.host} ({run}since {when}, command: {' '.join(self.argv)[:200]})"


def _parse(raw: bytes) -> Holder | None:
    try:
        data = json.loads(raw.decode())
        pid, host, since, argv = int(data["pid"]), str(data["host"]), float(data["since"]), list(data["argv"])
        return Holder(pid, host, since, argv, data.get("run_dir"))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _try(fd: int, kind: int) -> bool:
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


@dataclass
class _Entry:
    """This process's one descriptor of a folder's lock file (closing any other would drop its locks)."""

    folder: Path
    fd: int
    pid: int
    created: bool = False  # the folder did not exist before this process needed its lock
    readers: int = 0
    writer: bool = False
    record: Path | None = None
    record_fd: int = -1


_ENTRIES: dict[Path, _Entry] = {}


def _entry(folder: str | Path) -> _Entry:
    folder = Path(folder).expanduser()
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    entry = _ENTRIES.get(key)
    if entry is not None and entry.pid != os.getpid():  # inherited through fork: the locks stayed with the parent
        _ENTRIES.pop(key)
        entry = None
    if entry is None:
        entry = _Entry(key, os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644), os.getpid(), created)
        _ENTRIES[key] = entry
    return entry


def _same_file(entry: _Entry) -> bool:
    """Whether the locked descriptor is still the file at the path (a releasing writer removes it)."""
    try:
        a, b = os.fstat(entry.fd), os.stat(entry.folder / LOCK_NAME)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _lock(entry: _Entry, kind: int) -> bool:
    """Take ``kind`` without waiting, on the file now at the path (reopened when a releasing writer removed it)."""
    while _try(entry.fd, kind):
        if _same_file(entry):
            return True
        os.close(entry.fd)  # locked a removed file: drop it and try the new one
        entry.folder.mkdir(parents=True, exist_ok=True)  # (removed with it, when made only for a failed prepare)
        entry.fd = os.open(entry.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    return False


def _close_if_unused(entry: _Entry) -> None:
    """Without holds left: remove the lock file if nobody else holds it (and the folder, if it was made for it)."""
    if entry.readers or entry.writer or entry.pid != os.getpid():
        return
    if _try(entry.fd, fcntl.LOCK_EX) and _same_file(entry):  # nobody else: a waiting taker re-checks the path
        (entry.folder / LOCK_NAME).unlink(missing_ok=True)
        try:
            (entry.folder / READERS_DIR).rmdir()
        except OSError:
            pass
        if entry.created:
            try:
                entry.folder.rmdir()  # made only to hold the lock of a prepare that failed: leave nothing behind
            except OSError:
                pass
    os.close(entry.fd)  # drops whatever lock this process still had on the file
    _ENTRIES.pop(entry.folder, None)


def live_readers(folder: str | Path) -> list[Holder]:
    """The live runs reading ``folder`` (other processes; stale records of dead runs are removed)."""
    readers = Path(folder).expanduser() / READERS_DIR
    own = f"{socket.gethostname()}-{os.getpid()}.json"
    found = []
    for record in sorted(readers.glob("*.json")) if readers.is_dir() else []:
        if record.name == own:
            continue  # this process's own record: probing it would drop its lock
        try:
            fd = os.open(record, os.O_RDWR)
        except OSError:
            continue
        try:
            if _try(fd, fcntl.LOCK_EX):  # nobody holds it: the run that wrote it is gone
                record.unlink(missing_ok=True)
                continue
            holder = _parse(os.pread(fd, 1 << 16, 0))
            found.append(holder or Holder(-1, "?", time.time(), ["(starting)"]))
        finally:
            os.close(fd)
    return found


def _writer(entry: _Entry) -> Holder | None:
    return _parse(os.pread(entry.fd, 1 << 16, 0))


# ---------------------------------------------------------------------------------------------------- readers
@dataclass
class ReaderHold:
    """A run's shared hold on a data folder; ``release()`` (also at exit) lets writers in again."""

    folder: Path
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        entry = _ENTRIES.get(self.folder)
        if entry is None or entry.pid != os.getpid() or entry.readers == 0:
            return
        entry.readers -= 1
        if entry.readers:
            return
        if entry.record is not None:
            entry.record.unlink(missing_ok=True)  # while still locked: a probe never takes a live record for stale
            os.close(entry.record_fd)
            entry.record, entry.record_fd = None, -1
        if not entry.writer:
            _close_if_unused(entry)


def hold_for_reading(
    folder: str | Path, run_dir: str | None = None, log: Callable[[str], None] = print, poll: float = 0.5
) -> ReaderHold:
    """Take a shared hold on ``folder`` for a run that reads it (waiting while a ``prepare`` builds it).

    Args:
        folder: the data directory (created if missing, to hold the lock file).
        run_dir: the run directory named in messages (default: ``$LIGHTNING_CQK_RUN_DIR``, set by ``fit``).
        log: where the "waiting for prepare" message goes.
        poll: seconds between attempts while a writer holds the folder.
    """
    entry = _entry(folder)
    if entry.readers == 0 and not entry.writer:
        with _given_up_on_sigterm(entry, log, "this process had not started reading it"):
            _wait_for_readers_turn(entry, log, poll)
        record = entry.folder / READERS_DIR / f"{socket.gethostname()}-{os.getpid()}.json"
        record.parent.mkdir(exist_ok=True)
        fd = os.open(record, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.lockf(fd, fcntl.LOCK_EX)  # our own name: nobody else locks it but a probe, for an instant
        holder = Holder.me(run_dir or str(env_path(RUN_DIR_ENV) or "") or None)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)
        entry.record, entry.record_fd = record, fd
    entry.readers += 1
    hold = ReaderHold(entry.folder)
    atexit.register(hold.release)
    return hold


def _wait_for_readers_turn(entry: _Entry, log: Callable[[str], None], poll: float) -> None:
    """Take the shared lock, waiting (and saying for whom, every 5 minutes) while a prepare holds the folder."""
    said = None
    while not _lock(entry, fcntl.LOCK_SH):
        if said is None or time.monotonic() - said > 300:
            who = _writer(entry)
            log(
                f"data: {entry.folder} is being prepared by {who.describe() if who else 'another process'}; "
                "this run waits for it to finish and then reads the finished build."
            )
            said = time.monotonic()
        time.sleep(poll)


@contextmanager
def _given_up_on_sigterm(entry: _Entry, log: Callable[[str], None], state: str) -> Iterator[None]:
    """A wait for the folder that SIGTERM ends: say so, let go of the lock file, and let the process unwind."""
    with ending_cleanly_on_sigterm():
        try:
            yield
        except Terminated:
            log(f"data: stopped by SIGTERM while waiting for {entry.folder} ({state}).")
            _close_if_unused(entry)
            raise


# ---------------------------------------------------------------------------------------------------- writers
def _in_use_message(folder: Path, readers: list[Holder], what: str) -> str:
    runs = "; ".join(h.describe() for h in readers)
    kill = " ".join(str(h.pid) for h in readers if h.pid > 0)
    return (
        f"{what}: {folder} is being read by {len(readers)} live run(s): {runs}. Rebuilding it now would change the "
        "data under them (their losses would silently mix two builds). Wait for them to finish (or stop them: "
        f"kill {kill}; a run resumed on rebuilt shards is refused), or prepare into another folder "
        "(--output_dir <new folder>) and point new runs at it (--data.data_dir <new folder>)."
    )


@contextmanager
def writing(
    folder: str | Path, what: str = "prepare", log: Callable[[str], None] = print, poll: float = 0.5
) -> Iterator[bool]:
    """Hold ``folder`` exclusively while building it; yields True when it first waited for another writer.

    Raises:
        DataFolderInUse: live runs read the folder (or this process does); the message names them.
    """
    entry = _entry(folder)
    if entry.readers:
        raise DataFolderInUse(
            f"{what}: {entry.folder} is being read by this process (a run in it holds the folder), so it cannot be "
            "rebuilt here. Prepare into another folder (--output_dir <new folder>)."
        )
    if entry.writer:
        raise DataFolderInUse(f"{what}: {entry.folder} is already being prepared by this process (a nested prepare).")
    with _given_up_on_sigterm(entry, log, f"{what} had not started building it"):
        waited = _wait_for_writers_turn(entry, what, log, poll)
    entry.writer = True
    try:
        os.ftruncate(entry.fd, 0)
        os.pwrite(entry.fd, json.dumps(asdict(Holder.me())).encode(), 0)
        live_readers(entry.folder)  # removes the records of runs that died (none can be live: we hold it)
        yield waited
    finally:
        entry.writer = False
        os.ftruncate(entry.fd, 0)
        _close_if_unused(entry)


def _wait_for_writers_turn(entry: _Entry, what: str, log: Callable[[str], None], poll: float) -> bool:
    """Take the exclusive lock, waiting while another prepare builds; True when it waited for one.

    Raises:
        DataFolderInUse: live runs read the folder; the message names them.
    """
    waited, said, unnamed = False, None, time.monotonic() + 5.0
    while not _lock(entry, fcntl.LOCK_EX):
        if _lock(entry, fcntl.LOCK_SH):  # only readers hold it
            fcntl.lockf(entry.fd, fcntl.LOCK_UN)
            readers = live_readers(entry.folder)
            if readers or time.monotonic() > unnamed:  # (a reader writes its record just after taking its hold)
                _close_if_unused(entry)
                unknown = [Holder(-1, "?", time.time(), ["(a reader that left no record)"])]
                raise DataFolderInUse(_in_use_message(entry.folder, readers or unknown, what))
            time.sleep(0.05)
            continue
        waited = True  # another prepare builds it
        if said is None or time.monotonic() - said > 300:  # (said first at once: monotonic may start near 0)
            who = _writer(entry)
            log(
                f"{what}: {entry.folder} is being prepared by {who.describe() if who else 'another process'}; "
                "waiting for it to finish (then its build is reused when it is what this prepare asks for)."
            )
            said = time.monotonic()
        time.sleep(poll)
    return waited
