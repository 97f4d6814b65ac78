"""User errors: refusals whose message says what is wrong and how to fix it.

The command line prints such an error alone, as `lightning_cqk <command>: <message>`, and keeps the traceback in a
log file (`lightning_cqk.cli_errors`); any other exception is a bug and keeps its traceback. Each class also derives
from the builtin exception a caller would catch (ValueError, FileNotFoundError, RuntimeError), so library callers
and `except ValueError` keep working. Standard library only: model code may raise these.
"""

from __future__ import annotations


class UserError(Exception):
    """A setting or input the user can fix; the message names it and says how (the fix must work when pasted)."""


class ConfigError(UserError, ValueError):
    """A setting that cannot be applied (unknown backend or option, a value out of range, a checkpoint of another
    model than the configuration builds)."""


class MissingInputError(UserError, FileNotFoundError):
    """A file, directory or corpus that the command names does not exist or holds nothing usable."""


class UnavailableError(UserError, RuntimeError):
    """Something the run needs cannot be had on this machine (e.g. the GPT-2 vocabulary offline)."""
