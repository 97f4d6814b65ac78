"""tests/ is a pyramid: tests/unit/ mirrors the package, tests/contract/ holds the backend harness, tests/e2e/ the runs.

A unit test file `tests/unit/<sub>/test_<name>.py` tests the module `lightning_cqk/<sub>/<name>.py` (or the subpackage
`lightning_cqk/<sub>/<name>/`); several files may test one module as `test_<name>_<aspect>.py`. Every folder of
tests/unit/ that holds tests names a subpackage (`fixtures/` folders hold data). A stray is printed with where it goes.
The guard that keeps processes and Trainer.fit out of tests/unit/ is tests/unit/conftest.py; the tiny runs are built
by one harness, tests/tiny_run.py.
"""

from __future__ import annotations

import ast
import importlib.util
import multiprocessing
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "lightning_cqk"
UNIT = TESTS / "unit"
#: Folders of tests/unit/ that hold data for tests, not tests.
DATA_FOLDERS = {"fixtures", "__pycache__"}


def units_of(package_dir: Path) -> list[str]:
    """The module names (without .py) and subpackage names directly in `package_dir`."""
    modules = [p.stem for p in package_dir.glob("*.py") if p.name != "__init__.py"]
    return modules + [p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file()]


def unit_named(stem: str, units: list[str]) -> str | None:
    """The unit a test file's stem (`test_` removed) names: itself or its longest prefix ending before a `_`."""
    named = [u for u in units if stem == u or stem.startswith(u + "_")]
    return max(named, key=len) if named else None


def most_imported(test_file: Path) -> str | None:
    """The `lightning_cqk` module that `test_file` imports most often (where a stray most likely belongs)."""
    imported: Counter[str] = Counter()
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_cqk."):
            imported[node.module] += 1
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("lightning_cqk."))
    return imported.most_common(1)[0][0] if imported else None


def suggestion(test_file: Path) -> str:
    module = most_imported(test_file)
    if module is None:
        return "it imports nothing of lightning_cqk: it is not a unit test (tests/e2e/ or tests/)"
    *sub, name = module.split(".")[1:]
    return f"it imports {module} most: tests/unit/{'/'.join([*sub, f'test_{name}.py'])}"


def strays(unit_root: Path, package: Path) -> list[str]:
    """One line per folder of `unit_root` that names no subpackage of `package`, and per test file that names no
    module of its folder's subpackage, with where it should go."""
    found = []
    for folder in sorted([unit_root, *(p for p in unit_root.rglob("*") if p.is_dir())]):
        relative = folder.relative_to(unit_root)
        if DATA_FOLDERS & set(relative.parts):
            continue
        package_dir = package.joinpath(*relative.parts)
        tests = sorted(folder.glob("test_*.py"))
        if not (package_dir / "__init__.py").is_file():
            if tests or any(folder.iterdir()):
                found.append(
                    f"tests/unit/{relative.as_posix()}/ names no subpackage of lightning_cqk (no "
                    f"lightning_cqk/{relative.as_posix()}/__init__.py): move its files to the folder of the package "
                    "they test"
                )
            continue
        units = units_of(package_dir)
        for test in tests:
            if unit_named(test.stem.removeprefix("test_"), units) is None:
                where = "lightning_cqk" + "".join(f"/{p}" for p in relative.parts)
                found.append(
                    f"{test.relative_to(unit_root.parent).as_posix()} names no module of {where}/ "
                    f"(test_<module>[_<aspect>].py): {suggestion(test)}"
                )
    return found


def test_unit_tests_mirror_the_package():
    found = strays(UNIT, PACKAGE)
    assert not found, "tests/unit/ must mirror lightning_cqk/:\n" + "\n".join(found)


def test_the_mirror_check_names_a_stray_file_and_folder_and_where_they_go(tmp_path: Path):
    package, unit = tmp_path / "lightning_cqk", tmp_path / "unit"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "model" / "gpt.py").write_text("")
    (unit / "model").mkdir(parents=True)
    (unit / "model" / "test_gpt.py").write_text("")
    (unit / "model" / "test_gpt_init.py").write_text("")
    (unit / "model" / "test_shapes.py").write_text("from lightning_cqk.model.gpt import GPT\n")
    (unit / "reliability").mkdir()
    (unit / "reliability" / "test_x.py").write_text("")
    (unit / "model" / "fixtures").mkdir()
    (unit / "model" / "fixtures" / "weights.pt").write_text("")
    found = strays(unit, package)
    assert len(found) == 2, found
    assert found[0].startswith("unit/model/test_shapes.py names no module of lightning_cqk/model/"), found
    assert "tests/unit/model/test_gpt.py" in found[0]
    assert found[1].startswith("tests/unit/reliability/ names no subpackage"), found


def unit_guard():
    """tests/unit/conftest.py as a module (conftest files are not importable by name)."""
    spec = importlib.util.spec_from_file_location("unit_guard", UNIT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
        lambda: subprocess.check_output(["true"]),
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
        lambda: multiprocessing.get_context("fork").Process(target=print).start(),
        lambda: os.fork(),  # looked up at call time: the guard replaces os.fork
        lambda: os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], os.environ),
        lambda: os.system("true"),
        lambda: __import__("lightning").Trainer(logger=False).fit(None),
    ],
    ids=["subprocess.run", "check_output", "spawn", "fork-context", "os.fork", "posix_spawn", "os.system", "fit"],
)
def test_the_unit_guard_refuses_every_way_to_start_a_process_or_a_fit(start):
    guard = unit_guard()
    with pytest.MonkeyPatch.context() as monkeypatch:
        called = guard.refuse_processes_and_fit(monkeypatch)
        with pytest.raises(guard.UnitTestStartedARun, match="Move this test to tests/e2e/"):
            start()
    assert len(called) == 1, called


#: A Trainer built inline: `L.Trainer(`, `pl.Trainer(`, `lightning.Trainer(` or `lightning.pytorch.Trainer(`.
INLINE_TRAINER = re.compile(r"(?<![\w.])(?:L|pl|lightning|lightning\.pytorch)\.Trainer\(")
#: The harness that builds every Trainer of the tests.
HARNESS = TESTS / "tiny_run.py"


def inline_trainers(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root.parent).as_posix()}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if path != HARNESS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if INLINE_TRAINER.search(line) and not line.lstrip().startswith("#")
    ]


def test_no_test_builds_a_trainer_inline():
    found = inline_trainers(TESTS)
    assert not found, (
        "build Trainers through tests/tiny_run.py (`tiny_trainer(root, callbacks, **delta)`, or the `make_trainer` "
        "fixture), not inline:\n" + "\n".join(found)
    )


def test_the_inline_check_sees_each_spelling_outside_comments(tmp_path: Path):
    (tmp_path / "tests").mkdir()
    spellings = ["trainer = L.Trainer", "lightning.Trainer", "# L.Trainer in a comment", "self.L.Trainer", "pl.Trainer"]
    (tmp_path / "tests" / "test_x.py").write_text("".join(f"{s}(\n" for s in spellings))  # ( apart: not this file
    found = inline_trainers(tmp_path / "tests")
    assert [line.split(":")[1] for line in found] == ["1", "2", "5"], found
