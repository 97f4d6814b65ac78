"""User errors: refusals whose message says what is wrong and how to fix it.

The command line prints such an error alone, as `lightning_cqk <command>: <message>`, and keeps the traceback in a
log file (`lightning_cqk.cli.error_report`); any other exception is a bug and keeps its traceback. Each class also
derives from the builtin exception a caller would catch (ValueError, FileNotFoundError, RuntimeError), so library
callers and `except ValueError` keep working. Standard library only: model code may raise these.
"""

from __future__ import annotations

import errno
import os


class UserError(Exception):
    """A setting or input the user can fix; the message names it and says how (the fix must work when pasted)."""


class ConfigError(UserError, ValueError):
    """A setting that cannot be applied (unknown backend or option, a value out of range, a checkpoint of another
    model than the configuration builds)."""


class MissingInputError(UserError, FileNotFoundError):
    """A file, directory or corpus that the command names does not exist or holds nothing usable."""


class UnavailableError(UserError, RuntimeError):
    """Something the run needs cannot be had on this machine (e.g. the GPT-2 vocabulary offline)."""


class StorageFullError(UserError, OSError):
    """A write that failed because the disk is full (ENOSPC), a quota is used up (EDQUOT) or a file-size limit is
    reached (EFBIG). `errno`, `strerror` and `filename` are OSError's; the message says what was being written, what
    is left intact and what to do."""

    def __init__(self, code: int, path: str, message: str) -> None:
        super().__init__(code, os.strerror(code), path)
        self.message = message

    def __str__(self) -> str:
        return self.message


STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_full_errno(err: BaseException) -> int | None:
    """The errno of a full disk, quota or file-size limit behind `err` (itself, its cause or its context), or None.

    torch.save reports a failed write as a RuntimeError ("[enforce fail at inline_container.cc] ... unexpected pos")
    whose context is the OSError of the file object it wrote to; this finds that OSError."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_FULL_ERRNOS:
            return err.errno
        err = err.__cause__ or err.__context__
    return None
