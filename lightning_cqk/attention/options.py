"""Option names checked against an options dataclass, with a did-you-mean (backends and q/k transforms alike)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

from lightning_cqk.errors import ConfigError


def check_option_names(keys: Iterable[str], options_class: type, owner: str) -> None:
    """Raise ConfigError (a ValueError) naming the first key not a field of `options_class` ("... for <owner>")."""
    known = [f.name for f in dataclasses.fields(options_class)]
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown option {key!r} for {owner}.{hint} Valid options: {', '.join(sorted(known))}.")
