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


def test_the_layout_page_names_every_top_level_module_and_package():
    text = (REPO / "docs" / "layout.md").read_text()
    names = {p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    names |= {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert not {n for n in names if n not in text}, "docs/layout.md omits some of the package"
