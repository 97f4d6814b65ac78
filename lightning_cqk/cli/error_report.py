"""The command line's answer to a user error: the message alone, the traceback kept in a log file.

`lightning_cqk <command> ...` run from a shell catches the errors listed in `user_error_types()` (the
`lightning_cqk.errors.UserError` family and the run-directory refusals `ResumeRefused`, `RunDirectoryInUse`),
prints `lightning_cqk <command>: <message>` on stderr and exits with status 1. The traceback is written to
`error_log_path()`: `$LIGHTNING_CQK_LOG_DIR/last-error.log`, default `~/.cache/lightning_cqk/last-error.log`
(`$XDG_CACHE_HOME` honoured), overwritten by the next user error. `--debug` anywhere on the command line, or
`LIGHTNING_CQK_DEBUG=1`, prints the traceback instead. Every other exception is a bug: it propagates with its
traceback, untouched. Called from Python (`main([...])`), errors always propagate.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_cqk.environment import env_flag, env_path

DEBUG_FLAG = "--debug"
DEBUG_ENV = "LIGHTNING_CQK_DEBUG"
LOG_DIR_ENV = "LIGHTNING_CQK_LOG_DIR"
LOG_NAME = "last-error.log"


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exception types whose message is the whole answer (standard-library-only imports)."""
    from lightning_cqk.errors import UserError
    from lightning_cqk.run.directory import ResumeRefused
    from lightning_cqk.run.lock import RunDirectoryInUse

    return (UserError, ResumeRefused, RunDirectoryInUse)


def pop_debug(argv: list[str]) -> tuple[bool, list[str]]:
    """(debug wanted, argv without `--debug`): the flag or `LIGHTNING_CQK_DEBUG=1` (1/true/yes/on; 0/false/no/off or
    unset: off; anything else is refused, `environment.env_flag`). With `--debug` the variable is not read."""
    if DEBUG_FLAG in argv:
        return True, [a for a in argv if a != DEBUG_FLAG]
    return env_flag(DEBUG_ENV), argv


def error_log_path() -> Path:
    """Where the traceback of the last user error goes."""
    log_dir = env_path(LOG_DIR_ENV)
    if log_dir is not None:
        return log_dir / LOG_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lightning_cqk" / LOG_NAME


@contextmanager
def user_errors_reported(command: str, debug: bool) -> Iterator[None]:
    """Turn a user error raised inside into `lightning_cqk <command>: <message>` and exit status 1 (see module)."""
    try:
        yield
    except user_error_types() as err:
        if debug:
            raise
        sys.exit(f"lightning_cqk {command}: {err}\n({_save_traceback(command, err)})")


def _save_traceback(command: str, err: BaseException) -> str:
    path = error_log_path()
    text = "".join(traceback.format_exception(err))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"lightning_cqk {command} ({' '.join(sys.argv)})\n{text}")
    except OSError as log_err:
        return f"traceback not saved ({log_err}); --debug prints it"
    return f"traceback: {path}; --debug or {DEBUG_ENV}=1 prints it"
