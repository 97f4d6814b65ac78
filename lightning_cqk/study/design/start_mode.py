"""How a sweep starts its runs: "fork" (from the pre-imported worker, run/worker.py, where os.fork exists) or
"fresh" (a new python process per run); `lightning_cqk sweep --start` sets it, the dry-run estimate prices it."""

from __future__ import annotations

import os

from lightning_cqk.environment import env_choice

START_MODES = ("fork", "fresh")
START_ENV = "LIGHTNING_CQK_SWEEP_START"
#: How the sweep runner starts a run: "fork" (from a pre-imported worker, where os.fork exists) or "fresh".
#: `lightning_cqk sweep --start` sets it; None: $LIGHTNING_CQK_SWEEP_START (default fork), read when needed.
mode: str | None = None


def default_mode() -> str:
    """$LIGHTNING_CQK_SWEEP_START: fork or fresh (default fork); anything else is refused (`environment.env_choice`)."""
    return env_choice(START_ENV)


def resolved() -> str:
    """The mode runs start with now: fresh where asked or where os.fork is missing, else fork."""
    return "fresh" if (mode or default_mode()) == "fresh" or not hasattr(os, "fork") else "fork"
