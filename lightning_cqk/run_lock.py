"""A run directory belongs to one live process: `<run dir>/.lock` holds its pid, host and start time.

`lightning_cqk fit` takes the lock as soon as it knows the run directory, before any model, data or logger is built,
so a second `fit` aimed at a directory in use (typically `--ckpt_path last` while the first run still trains) stops
at once with a message naming the live process, instead of interleaving logs and checkpoints with it.

The lock file is created with `O_CREAT | O_EXCL` (atomic). A lock whose process is gone (killed, crashed, machine
rebooted) is stale: the next run takes it over and says so. Liveness is checked with `kill(pid, 0)` plus the process
start time from `/proc/<pid>/stat` where available, so a recycled pid is not mistaken for the old run. A lock taken on
another host cannot be checked from here: the message says which host and how to clear it. The lock is removed when
the process exits normally (atexit); a SIGKILL leaves it behind, stale, for the restart to take over.
"""

from __future__ import annotations

import atexit
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
    """The run directory is locked by a process that is still running (or by another host)."""


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
        start = process_start(self.pid)
        return self.start is None or start is None or start == self.start

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = " ".join(self.argv)[:200]
        return f"pid {self.pid} on host {self.host}, since {when}, command: {command}"


def is_rank_zero_process() -> bool:
    """False in the extra processes of a multi-process launch (they share rank zero's run directory)."""
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (Linux), None elsewhere or when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22; the command name in () may contain spaces


@dataclass
class RunLock:
    """A held lock; `release()` (also at exit) removes the file if it is still ours."""

    path: Path
    owner: LockOwner

    def release(self) -> None:
        try:
            current = _read(self.path)
        except (OSError, ValueError):
            current = None
        if current is not None and current.pid == self.owner.pid and current.host == self.owner.host:
            self.path.unlink(missing_ok=True)
        _HELD.pop(self.path, None)


def _read(path: Path) -> LockOwner:
    data = json.loads(path.read_text())
    return LockOwner(int(data["pid"]), str(data["host"]), data.get("start"), float(data["since"]), list(data["argv"]))


def _create(path: Path, owner: LockOwner) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(owner), f)
    return True


def acquire(run_dir: str | Path, log=print) -> RunLock:
    """Lock `run_dir` for this process (creating the folder), taking over a stale lock; re-entrant.

    Raises:
        RunDirectoryInUse: a live process (or one on another host) holds it; the message says how to proceed.
    """
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = LockOwner.me()
    for _ in range(5):
        if _create(path, me):
            break
        try:
            owner = _read(path)
        except FileNotFoundError:
            continue  # released meanwhile: try again
        except (OSError, ValueError, KeyError, TypeError):
            owner = None  # unreadable (a crash while writing it): stale
        if owner is not None and owner.pid == me.pid and owner.host == me.host:
            break  # ours already (a second CLI call in this process)
        alive = owner.alive() if owner is not None else False
        if alive is None:
            raise RunDirectoryInUse(
                f"Run directory {folder} is locked by a run on another host ({owner.describe()}). If that run is "
                f"finished or dead, delete {path} and start again; otherwise wait for it, or start this run in "
                "another directory (drop --ckpt_path for a fresh one, or set --trainer.logger.init_args.version)."
            )
        if alive:
            raise RunDirectoryInUse(
                f"Run directory {folder} is in use by a live run ({owner.describe()}). Two processes must not write "
                f"into one run. Wait for it to finish or stop it (kill {owner.pid}) and resume with --ckpt_path "
                "last; or start a separate run (drop --ckpt_path for a fresh directory, or set "
                "--trainer.logger.init_args.version)."
            )
        stale = path.with_name(f"{LOCK_NAME}.stale-{me.pid}")
        try:
            os.replace(path, stale)  # one taker wins; the others find the lock gone or fresh
        except FileNotFoundError:
            continue
        stale.unlink(missing_ok=True)
        who = owner.describe() if owner is not None else "an unreadable lock file"
        log(f"run lock: took over {path} from a run that is no longer running ({who}).")
    else:
        raise RunDirectoryInUse(f"Could not take the lock {path}: other processes keep taking it. Try again.")
    lock = RunLock(path, me)
    if path not in _HELD:
        atexit.register(lock.release)
    _HELD[path] = lock
    return lock
