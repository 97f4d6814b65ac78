"""The maps a reader follows stay true (issue 33): the package's doctests run, every test file a docstring cites
exists, study/__init__.py names every module of the folder and its stages, and docs/layout.md names every top-level
module."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lightning_cqk"


@pytest.mark.parametrize("module", ["lightning_cqk.attention"])
def test_the_doctests_in_package_docstrings_hold(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted and not result.failed


def test_every_test_file_a_package_docstring_cites_exists():
    cited = {}
    for path in PACKAGE.rglob("*.py"):
        for name in re.findall(r"\btests/[\w/]+\.py\b", path.read_text()):
            cited.setdefault(name, path.relative_to(REPO))
    missing = {name: str(where) for name, where in cited.items() if not (REPO / name).is_file()}
    assert not missing, f"cited but absent: {missing}"


def test_the_study_folder_map_names_every_module():
    text = importlib.import_module("lightning_cqk.study").__doc__
    modules = {p.name for p in (PACKAGE / "study").rglob("*.py") if p.name != "__init__.py"}
    assert not {m for m in modules if m not in text}, "study/__init__.py does not name every module"


#: Folders whose modules are named by a map of their own (tested above), not one by one in docs/layout.md.
OWN_MAPS = {"study"}
#: At most this many loose modules in lightning_cqk/ besides its doors __init__.py and __main__.py (issue 46).
MAX_LOOSE = 5


def layout_entries(text: str) -> dict[str, str]:
    """{entry: its text} of the package's tree in docs/layout.md: `errors.py`, `run/`, ... (column 2 of the block
    that starts `lightning_cqk/`), each with its description and continuation lines."""
    block = text.split("```\nlightning_cqk/\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if not line.startswith("  "):
            break  # configs/, callbacks/, ... of the repository: past the package
        if line[2] != " ":
            current, _, rest = line[2:].partition(" ")
            entries[current] = rest
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def package_items(folder: Path) -> set[str]:
    """`name.py` and `name/` of a folder of the package (doors and caches aside)."""
    modules = {p.name for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return modules | {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}


def test_the_layout_page_names_the_package_as_it_is():
    """docs/layout.md cannot go stale: its tree names exactly the package's top-level modules and folders, each
    folder's description names every module in it (and its sub-folders), and every file or folder it names exists."""
    entries = layout_entries((REPO / "docs" / "layout.md").read_text())
    assert set(entries) == package_items(PACKAGE), (
        f"docs/layout.md's tree and the package differ: only in the page "
        f"{sorted(set(entries) - package_items(PACKAGE))}"
        f", only in the package {sorted(package_items(PACKAGE) - set(entries))}"
    )
    unnamed, absent = {}, {}
    for entry, description in entries.items():
        if not entry.endswith("/"):
            continue
        folder = PACKAGE / entry.rstrip("/")
        if entry.rstrip("/") not in OWN_MAPS:
            items = {p.name for p in folder.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts}
            items |= {f"{p.name}/" for p in folder.rglob("*") if (p / "__init__.py").is_file()}
            missing = sorted(i for i in items if not re.search(r"(?<![\w.])" + re.escape(i), description))
            if missing:
                unnamed[entry] = missing
        for name in re.findall(r"(?<![\w./-])((?:\w+/)*\w+(?:\.py|/))(?![\w])", description):
            here = [folder / name, PACKAGE / name, *(folder.rglob(name) if "/" not in name else [])]
            if not any(p.exists() for p in here) and not name.startswith(("docs/", "tests/", "configs/")):
                absent.setdefault(entry, []).append(name)
    assert not unnamed, f"docs/layout.md does not name these modules of their folder: {unnamed}"
    assert not absent, f"docs/layout.md names files or folders the package does not have: {absent}"


def test_the_top_level_holds_few_loose_modules_and_no_two_modules_share_a_name():
    """At most MAX_LOOSE loose modules; every other module in a folder whose name says what it holds, and no two
    modules or folders of the package share a basename (OWN_MAPS folders aside: issue 46 leaves them to their move)."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(loose) <= MAX_LOOSE, f"{len(loose)} loose modules in lightning_cqk/: {loose}"
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[0] in OWN_MAPS or "__pycache__" in rel.parts:
            continue
        names.setdefault(path.stem, []).append(str(rel))
    for folder in PACKAGE.rglob("__init__.py"):
        rel = folder.parent.relative_to(PACKAGE)
        if rel.parts and rel.parts[0] not in OWN_MAPS:
            names.setdefault(folder.parent.name, []).append(f"{rel}/")
    shared = {name: where for name, where in names.items() if len(where) > 1}
    assert not shared, f"modules or folders sharing a name: {shared}"
