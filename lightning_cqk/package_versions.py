"""The versions of the packages a run uses, as recorded in `run.json` (each attempt) and a sweep's status files.

A study's numbers depend on more than the code: a torch, Lightning, litdata, numpy, scipy or lm-eval release can
change them without a commit here (requirements.lock pins the versions the suite was run with). Each attempt of a
run records `packages` (`package_versions()`: Python and every direct dependency of pyproject.toml, the `eval` and
`data` extras included; None for one not installed), and a sweep resumed under other versions says which changed
(`describe_difference`), as it does for code revisions: each attempt records `revision` too (`code_revision`: the git
commit of the checkout the package is imported from, `-dirty` with uncommitted changes to tracked files). Standard
library only.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The distributions pyproject.toml depends on (dependencies, then the eval and data extras), by their PyPI names;
# tests/test_locked_environment.py checks that this list and pyproject.toml name the same packages.
DIRECT_DEPENDENCIES = (
    "torch",
    "lightning",
    "jsonargparse",
    "torchmetrics",
    "litdata",
    "tiktoken",
    "tensorboard",
    "numpy",
    "matplotlib",
    "scipy",
    "lm-eval",
    "datasets",
)


def package_versions() -> dict[str, str | None]:
    """{'python': ..., 'lightning-cqk': ..., '<dependency>': version or None when not installed}."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("lightning-cqk", *DIRECT_DEPENDENCIES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def differences(old: dict[str, str | None], new: dict[str, str | None]) -> dict[str, tuple[str | None, str | None]]:
    """{package: (old, new)} for every package whose version differs (a package only one side names is skipped:
    a record written before it was listed says nothing about it). `lightning-cqk` itself is left to the code
    revision."""
    return {k: (old[k], new[k]) for k in sorted(set(old) & set(new)) if k != "lightning-cqk" and old[k] != new[k]}


def describe_difference(old: dict[str, str | None], new: dict[str, str | None]) -> str:
    """'torch 2.12.0 -> 2.13.0, numpy 2.4.5 -> 2.4.6' ('not installed' for None)."""
    return ", ".join(
        f"{k} {a or 'not installed'} -> {b or 'not installed'}" for k, (a, b) in differences(old, new).items()
    )


def git_revision(cwd: str | Path | None = None) -> dict[str, Any]:
    """{'revision': HEAD commit or None, 'dirty': uncommitted changes to tracked files} of the code that runs.

    Default: the git checkout the imported `lightning_cqk` package is tracked in (the sweep may be started from any
    directory); an installed package (no checkout tracks it, e.g. a wheel in a virtualenv that lies inside some other
    repository) gives None for both, and `_versions` records the installed version instead.
    """
    try:
        if cwd is None:
            import lightning_cqk

            cwd = Path(lightning_cqk.__file__).resolve().parent
            tracked = ["git", "ls-files", "--error-unmatch", "__init__.py"]
            if subprocess.run(tracked, cwd=cwd, capture_output=True, text=True).returncode != 0:
                return {"revision": None, "dirty": None}
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        diff = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=cwd, capture_output=True, text=True)
        return {"revision": rev.stdout.strip(), "dirty": bool(diff.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"revision": None, "dirty": None}


def code_revision() -> str:
    """The code this process runs, in one string: the commit, `-dirty` when tracked files have uncommitted changes,
    `unknown` outside a git checkout (an installed package: its version is in `packages`)."""
    git = git_revision()
    revision = git.get("revision")
    return "unknown" if not revision else revision + ("-dirty" if git.get("dirty") else "")
