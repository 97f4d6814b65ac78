"""The locked environment (issue 26): `make install` installs requirements.lock exactly.

When the interpreter running the suite is the repository's own `.venv` (what `make install` builds and `make test`
uses), every lock entry whose environment marker holds here must be installed at exactly its locked version (local
labels aside: torch `2.13.0+cpu` is `2.13.0`), and every direct dependency of pyproject.toml must be in the lock.
An entry the installed packages do not require is allowed to be absent: the lock is universal, so it holds torch's
CUDA libraries (`nvidia-*`, `triton`), which a CPU build of torch does not ask for; when installed, it must match.
Another interpreter (a developer's own environment, or `make test-latest`, which sets LIGHTNING_CQK_UNLOCKED=1)
skips, saying why. torchvision is in neither: the lock leaves it out and the install removes it (see the Makefile).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from lightning_cqk.environment import env_flag

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's dependency
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"


def read_lock(text: str) -> list[tuple[str, str, Marker | None]]:
    """(name, version, marker) of every `name==version [; marker]  # via ...` line."""
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)\s*(?:;\s*(.+))?", line)
        assert match, f"requirements.lock: not a pinned line: {line!r}"
        name, version, marker = match.groups()
        entries.append((canonicalize_name(name), version, Marker(marker) if marker else None))
    return entries


def applicable(entries: list[tuple[str, str, Marker | None]]) -> dict[str, str]:
    """{name: version} of the entries whose marker holds for this interpreter and platform."""
    return {name: version for name, version, marker in entries if marker is None or marker.evaluate()}


def mismatches(locked: dict[str, str]) -> list[str]:
    """Every locked package that is missing or installed at another version (local labels ignored: 2.13.0+cpu is
    2.13.0)."""
    problems = []
    for name, version in sorted(locked.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: locked {version}, not installed")
            continue
        if Version(installed).public != Version(version).public:
            problems.append(f"{name}: locked {version}, installed {installed}")
    return problems


EXTRAS = ("test", "dev", "eval", "data")  # the Makefile's EXTRAS
# Required but deliberately not locked: this project itself, and torchvision (litdata's image serializers; see above).
NOT_LOCKED = {"lightning-cqk", "torchvision"}


def required_here(root: str = "lightning-cqk", extras: tuple[str, ...] = EXTRAS) -> set[str]:
    """Every distribution that `root[extras]` requires on this interpreter, by the installed packages' metadata
    (markers evaluated here; a requirement's extras followed)."""
    seen: set[str] = set()
    todo = [(canonicalize_name(root), frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = name + "[" + ",".join(sorted(wanted)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # missing: `mismatches` names it
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {k.split("[", 1)[0] for k in seen}


def direct_dependencies() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def locked_interpreter_or_skip() -> None:
    if env_flag("LIGHTNING_CQK_UNLOCKED"):
        pytest.skip("LIGHTNING_CQK_UNLOCKED is set (make test-latest): the newest releases, not the lock")
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"not the repository's .venv ({sys.prefix}): only `make install` promises the locked versions")


def test_every_direct_dependency_is_locked_and_torchvision_is_left_out():
    entries = read_lock(LOCK.read_text())
    names = {name for name, _, _ in entries}
    assert not direct_dependencies() - names, "pyproject.toml names packages the lock does not pin: run `make lock`"
    assert "torchvision" not in names


def test_the_locked_versions_are_installed():
    locked_interpreter_or_skip()
    locked = applicable(read_lock(LOCK.read_text()))
    required = required_here()
    installed = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
    problems = mismatches({n: v for n, v in locked.items() if n in required or n in installed})
    problems += [f"{n}: required, not in the lock" for n in sorted(required - set(locked) - NOT_LOCKED)]
    assert not problems, "the environment differs from requirements.lock (run `make install`):\n" + "\n".join(problems)
    assert not any(d.metadata["Name"] == "torchvision" for d in metadata.distributions()), "make install removes it"


def test_the_check_sees_a_wrong_version_and_a_marker_for_another_python():
    torch = metadata.version("torch")
    entries = read_lock(
        f"torch=={torch}  # via lightning\n"
        "numpy==0.0.1 ; python_full_version < '3.0'  # another Python: not applicable\n"
        f"scipy==0.0.1 ; python_full_version >= '3.0'\n"
    )
    locked = applicable(entries)
    assert set(locked) == {"torch", "scipy"}
    assert mismatches(locked) == [f"scipy: locked 0.0.1, installed {metadata.version('scipy')}"]
    assert mismatches({"torch": Version(torch).public + "+cpu"}) == []  # local labels do not count


def test_what_is_required_here_follows_extras_and_markers():
    required = required_here()
    assert {"torch", "lightning", "lm-eval", "datasets", "pytest", "ruff", "filelock"} <= required
    assert "lm-eval" not in required_here(extras=())


def test_make_install_installs_from_the_lock():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^LOCK := requirements\.lock$", makefile, re.M)
    installed_target = makefile.split("$(BIN)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "$(LOCK)" in installed_target.splitlines()[0], "the install must be redone when the lock changes"
    pip_lines = [line for line in installed_target.splitlines() if "pip install" in line and "-e " in line]
    assert pip_lines and all("-c $(LOCK)" in line for line in pip_lines), pip_lines
    assert re.search(r"^(quickstart|test):\s*install\b", makefile, re.M)
