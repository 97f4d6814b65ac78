"""Parser errors that say how to fix them: a did-you-mean for unknown config keys and flags, and what a linked key
(model.config.block_size, model.config.vocab_size) is set from. Used by `CQKCLI` as its `parser_class`.

jsonargparse reports an unknown key as "Group 'model' does not accept option 'config.n_layr'", "Option 'x' is not
accepted" or "Unrecognized arguments: --trainer.max_stepz=3"; the hint appended to the message names the closest known
keys among the same group's keys (difflib), else among all keys. Tests: `tests/e2e/reliability/test_bad_inputs.py`.
"""

from __future__ import annotations

import difflib
import re
import sys
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser


class HintingArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors for unknown keys add a did-you-mean and say how to fix linked keys.

    An error prints a one-line usage (the full one is a hundred lines above the message; `--help` still shows it),
    and the program is called `lightning_cqk` (so the printed `... fit --help` tip works when pasted).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prog", "lightning_cqk")
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        parser = getattr(ex, "subcommand_parser", None) or self
        return super().error(message + _hint_for(message, parser), ex)

    def print_usage(self, file: Any = None) -> None:
        (file or sys.stdout).write(f"usage: {self.prog.replace(' [options]', '')} [options]\n")


_LINKED = {
    "model.config.block_size": "data.seq_len (model and data cannot disagree); set --data.seq_len instead",
    "model.config.vocab_size": "the data tokenizer's vocabulary; set --data.tokenizer instead",
}


def _hint_for(message: str, parser: Any) -> str:
    """A hint for a parser error: the closest known key for an unknown one, or what a linked key is set from."""
    if "hint: " in message:  # a nested (subclass) parser already added one
        return ""
    for key, source in _LINKED.items():
        if f"--> {key}" in message or f"'{key}'" in message:
            return f"\nhint: {key} is not set directly: it is linked to {source}."
    match = re.search(r"(?:does not accept option|Option|Key) '([^']+)'", message) or re.search(
        r"Unrecognized arguments: --([^\s=]+)", message
    )
    if not match:
        return ""
    unknown = match.group(1)
    group = re.search(r"Group '([^']+)' does not accept", message)
    if group:
        unknown = f"{group.group(1)}.{unknown}"
    known = _known_keys(parser)
    parent = unknown.rsplit(".", 1)[0] if "." in unknown else ""
    siblings = [k for k in known if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
    close = difflib.get_close_matches(unknown, siblings or known, n=2, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(unknown, known, n=2, cutoff=0.6)
    where = "in a --config file or on the command line"
    if close:
        return f"\nhint: {unknown!r} is not a known key {where}. Did you mean {' or '.join(map(repr, close))}?"
    return f"\nhint: {unknown!r} is not a known key {where}; `--help` lists them and `--print_config` shows them all."


def _known_keys(parser: Any) -> list[str]:
    keys = []
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", "")
        if dest and dest not in ("help", "config", "print_config") and not dest.startswith("=="):
            keys.append(dest)
    return keys
