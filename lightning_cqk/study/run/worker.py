"""Pay a run's start once per sweep: a fork server that imports torch, Lightning and this package once, then starts
each `lightning_cqk fit` run as a forked child of that pre-imported process.

    lightning_cqk sweep SPEC --start fork     # default on Linux: runs are forked from one pre-imported worker
    lightning_cqk sweep SPEC --start fresh    # each run is a new `python -m lightning_cqk fit` process (as before)

Importing torch, Lightning, litdata and TensorBoard takes most of a tiny CPU run's start (about 8-15 s on one busy
core); a fork of a process that has already imported them starts a run in milliseconds. The child is what a fresh
`python -m lightning_cqk fit ...` process would be at its first line: the server runs no torch work before forking
(no thread pool exists yet: the server checks it has one thread), the child gets the run's environment (the server
is started with that same environment, so what torch and OpenMP read at import is the run's: `OMP_NUM_THREADS`, one
thread per run with `--jobs` > 1), its working directory, `sys.argv` as `-m lightning_cqk` sets it, the default
SIGINT/SIGTERM/SIGUSR1 handling, stdin from /dev/null and stdout + stderr appended to the run's log, and exits
through the interpreter's exit handlers with the CLI's exit status. So a run's numbers are identical to a fresh
process's to the last digit (tests/e2e/study/test_worker.py compares the final validation loss and every weight).

The runner talks to the server over two pipes, one JSON line per message: a request {"argv", "env", "cwd", "log"}
is answered {"pid"}; when a child ends the server sends {"exited": pid, "returncode"} (a signal's death is -signum,
as `subprocess` reports it). `ForkedRun` is the runner's handle of one run, with `subprocess.Popen`'s `poll`, `wait`,
`terminate`, `kill` and `pid`, so the runner's scheduling and interrupt code treat both kinds alike. The server
ignores SIGINT, SIGTERM and SIGUSR1 (a Ctrl-C, `timeout` or SLURM's stop signal sent to the sweep's process group
reaches each run itself, as before, and the runner then collects their exit statuses through the server) and exits
when the runner closes its pipe or dies; runs in flight then go on, as a fresh process would after its runner was
killed.

`--start fork` needs `os.fork` (Linux; elsewhere runs start fresh). Servers are per environment: runs of one sweep
share one (a run whose environment differs gets its own).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from lightning_cqk.study.design import start_mode

#: What the server imports before it forks: what `lightning_cqk fit` imports anyway, so a child imports nothing a
#: fresh process would not.
PRELOAD = (
    "torch",
    "lightning.pytorch",
    "lightning_cqk.cli.main",
    "lightning_cqk.cli.trainer",
    "lightning_cqk.module",
    "lightning_cqk.data",
    "lightning_cqk.callbacks",
    "litdata",
    "tensorboard.backend.event_processing.event_accumulator",
)
_servers: dict[tuple[tuple[str, str], ...], ForkServer] = {}
#: What the server ignores: Ctrl-C, SIGTERM and SIGUSR1 (SLURM's stop before a time limit, sent to every process of
#: the job step) reach each run itself and its runner, which collects the runs' exits through the server.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def start_run(cmd: list[str], env: dict[str, str], log: Any) -> Any:
    """Start `cmd` (`python -m lightning_cqk fit ...`) with `env`, stdout and stderr into the open file `log`: a
    `subprocess.Popen`, or a `ForkedRun` of this environment's fork server when `mode` is fork and os.fork exists."""
    chosen = start_mode.mode or start_mode.default_mode()
    if chosen not in start_mode.START_MODES:
        raise ValueError(f"sweep start mode {chosen!r}: use one of {', '.join(start_mode.START_MODES)}")
    if chosen == "fresh" or not hasattr(os, "fork") or cmd[1:3] != ["-m", "lightning_cqk"]:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    key = tuple(sorted(env.items()))
    server = _servers.get(key)
    if server is None or not server.alive():
        server = _servers[key] = ForkServer(env)
    log.flush()
    return server.start(cmd[3:], env, os.getcwd(), log.name)


class ForkServer:
    """The runner's side of one fork server (module docstring): start it, start runs in it, collect exit codes."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lightning_cqk.study.run.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.exits: dict[int, int] = {}
        self._buffer = b""
        ready = self._next_message(timeout=None)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the sweep's fork server did not start: {ready}")
        atexit.register(self.close)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log: str) -> ForkedRun:
        request = {"argv": argv, "env": env, "cwd": cwd, "log": log}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        while True:  # exits of other runs may come first
            message = self._next_message(timeout=None)
            if "pid" in message:
                return ForkedRun(self, int(message["pid"]))

    def pump(self, timeout: float | None) -> None:
        """Read the exit messages that arrive within `timeout` seconds (0: those already sent)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._readable(left):
                return
            message = self._next_message(timeout=0)
            if not message:
                return
            timeout, deadline = 0, time.monotonic()  # got one: take what else is there, then return

    def _readable(self, timeout: float | None) -> bool:
        return b"\n" in self._buffer or bool(select.select([self.proc.stdout], [], [], timeout)[0])

    def _next_message(self, timeout: float | None) -> dict[str, Any]:
        """The next message ({} when none came within `timeout`); exit messages are also kept in `exits`."""
        while b"\n" not in self._buffer:
            if not self._readable(timeout):
                return {}
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("the sweep's fork server ended unexpectedly (see the sweep's stderr)")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        if "exited" in message:
            self.exits[int(message["exited"])] = int(message["returncode"])
        return message

    def close(self) -> None:
        """End the server (its runs in flight go on, as a fresh process would)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


class ForkedRun:
    """A run started by a `ForkServer`: `subprocess.Popen`'s poll, wait, terminate, kill, pid and returncode."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(timeout=0)
            self.returncode = self.server.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"run pid {self.pid}", timeout)
            self.server.pump(timeout=0.5 if left is None else min(0.5, left))
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # ended meanwhile: its exit message is on its way
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ------------------------------------------------------------------------------------------------- the server
def serve() -> None:
    """The fork server's loop (`python -m lightning_cqk.study.run.worker`): import, then fork one child per request."""
    import importlib
    import threading

    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything printed while importing goes to stderr, never into the replies
    for stop in STOP_SIGNALS:  # the runner forwards a stop to its runs; the server itself stays
        signal.signal(stop, signal.SIG_IGN)
    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"the fork server has {threading.active_count()} threads after its imports; it needs one")
    replies.write(b'{"ready": true}\n')
    requests = sys.stdin.buffer
    while True:
        _reap(replies)
        if not select.select([requests], [], [], 0.2)[0]:
            continue
        line = requests.readline()
        if not line:
            return  # the runner closed the pipe or died
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request)  # never returns
        replies.write((json.dumps({"pid": pid}) + "\n").encode())


def _reap(replies: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write((json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())


def _child(request: dict[str, Any]) -> None:
    """Become `python -m lightning_cqk <argv>` in the request's environment, directory and log; exit as it would."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = _run_cli(request["argv"])
        atexit._run_exitfuncs()  # what an interpreter runs at its end (TensorBoard writers, multiprocessing, ...)
    finally:  # the child never returns into the server's loop
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 (a closed stream: nothing left to flush)
                pass
        if code == INTERRUPTED:  # an uncaught Ctrl-C ends a fresh interpreter by SIGINT (returncode -2)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


INTERRUPTED = -int(signal.SIGINT)


def _run_cli(argv: list[str]) -> int:
    """The package's `__main__` run as `python -m lightning_cqk` runs it (runpy, the interpreter's own mechanism for
    `-m`: the door of the package, so the sweep layer imports nothing of the command line); the exit code an
    interpreter would end with."""
    import importlib.util
    import runpy
    import traceback

    spec = importlib.util.find_spec("lightning_cqk.__main__")
    sys.argv = [str(spec.origin if spec else "lightning_cqk"), *argv]
    try:
        runpy.run_module("lightning_cqk", run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return INTERRUPTED
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    serve()
