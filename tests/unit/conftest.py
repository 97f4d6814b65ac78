"""The unit layer's guard: a test under tests/unit/ starts no process and trains no Trainer.

Every test here runs with `subprocess.Popen` (hence `subprocess.run`, `check_output`, ...), a multiprocessing
process's `start` (hence `torch.multiprocessing`, process pools), `os.fork` / `os.posix_spawn` / `os.system` / the
`os.spawn*` and `os.exec*` family, and `lightning.Trainer.fit` replaced by a refusal: the call raises
`UnitTestStartedARun`, and a test that catches it still fails, at teardown, naming what it called. Such a test is an
end-to-end test: move it to tests/e2e/ (through the tiny-run harness, tests/tiny_run.py). This keeps `make test-fast`
(unit + contract smoke) a loop of seconds.
"""

from __future__ import annotations

import functools
import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest

#: The `os` functions that start (or replace this process with) another program.
OS_PROCESS_STARTERS = (
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "system",
    "popen",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "execl",
    "execle",
    "execlp",
    "execlpe",
    "execv",
    "execve",
    "execvp",
    "execvpe",
)


class UnitTestStartedARun(RuntimeError):
    """A unit test started a process or called `Trainer.fit`."""


def refusal(what: str) -> str:
    return (
        f"a unit test called {what}: tests/unit/ starts no process and calls no Trainer.fit (tests/unit/conftest.py). "
        "Move this test to tests/e2e/ (the tiny runs, through tests/tiny_run.py), or test the function without the run."
    )


def refuse_processes_and_fit(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every way to start a process, and `Trainer.fit`, by a refusal (`UnitTestStartedARun`); the returned
    list collects what was called (a test that catches the refusal still fails at teardown)."""
    import lightning.pytorch as pl

    called: list[str] = []

    def refuse(what: str, original: Callable[..., object]) -> Callable[..., None]:
        @functools.wraps(original)  # its signature: the CLI introspects Trainer.fit's, and then reaches the refusal
        def refused(*args: object, **kwargs: object) -> None:
            called.append(what)
            raise UnitTestStartedARun(refusal(what))

        return refused

    popen = "subprocess.Popen (subprocess.run, check_output, ...)"
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse(popen, subprocess.Popen.__init__))
    start = multiprocessing.process.BaseProcess.start
    monkeypatch.setattr(
        multiprocessing.process.BaseProcess, "start", refuse("a multiprocessing process's start()", start)
    )
    for name in OS_PROCESS_STARTERS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}", getattr(os, name)))
    monkeypatch.setattr(pl.Trainer, "fit", refuse("Trainer.fit", pl.Trainer.fit))
    return called


@pytest.fixture(autouse=True)
def _no_process_no_fit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    called = refuse_processes_and_fit(monkeypatch)
    yield
    if called:
        pytest.fail(refusal(" and ".join(dict.fromkeys(called))), pytrace=False)
