"""Every `LIGHTNING_CQK_*` environment value is read by one helper (issue 45 item 10): a malformed or non-finite value
is refused in one paragraph naming the variable and what it expects, never silently taken (`nan` hours turned the
long-run check off) and never an import-time traceback (`LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS=x` broke every
`sweep`); every variable the package names is declared, and no module reads one around the helper."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_cqk import environment
from lightning_cqk.callbacks.run_length import limit_hours_from_env
from lightning_cqk.cli.error_report import pop_debug
from lightning_cqk.environment import VARIABLES, EnvironmentValueError

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "lightning_cqk"
READERS = {
    "number": environment.env_number,
    "flag": environment.env_flag,
    "choice": environment.env_choice,
    "modules": environment.env_modules,
    "path": environment.env_path,
    "json": environment.env_json,
}
BAD = [
    ("LIGHTNING_CQK_LONG_RUN_HOURS", "nan"),
    ("LIGHTNING_CQK_LONG_RUN_HOURS", "inf"),
    ("LIGHTNING_CQK_LONG_RUN_HOURS", "2 days"),
    ("LIGHTNING_CQK_PLAN_TIMEOUT", "0"),
    ("LIGHTNING_CQK_PLAN_TIMEOUT", "-inf"),
    ("LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS", "x"),
    ("LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS", "-5"),
    ("LIGHTNING_CQK_SWEEP_START", "spawn"),
    ("LIGHTNING_CQK_TRUSTED_MODULES", "mylab,my-lab"),
    ("LIGHTNING_CQK_DEBUG", "maybe"),
    ("LIGHTNING_CQK_RUN_PLAN", "{not json"),
    ("LIGHTNING_CQK_UNLOCKED", "2"),
]


def test_nan_hours_are_refused_not_a_check_turned_off(monkeypatch):
    monkeypatch.setenv("LIGHTNING_CQK_LONG_RUN_HOURS", "nan")
    with pytest.raises(EnvironmentValueError, match="LIGHTNING_CQK_LONG_RUN_HOURS='nan' is not a finite number"):
        limit_hours_from_env()


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v}" for n, v in BAD])
def test_a_malformed_value_is_one_paragraph_whose_advice_works_when_pasted(monkeypatch, name, value):
    variable = VARIABLES[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentValueError) as caught:
        READERS[variable.kind](name)
    message = str(caught.value)
    assert "\n" not in message and f"{name}={value!r}" in message and variable.expects in message
    export = re.search(r"`export (\w+)=(.*?)`", message)
    assert export and export.group(1) == name and f"`unset {name}`" in message
    monkeypatch.setenv(name, shlex.split(export.group(2))[0])  # the suggested value, as the shell would pass it
    READERS[variable.kind](name)
    monkeypatch.delenv(name)
    READERS[variable.kind](name)  # unset: the default


def test_unset_empty_and_well_formed_values(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert environment.env_number("LIGHTNING_CQK_LONG_RUN_HOURS") == 24.0
    assert environment.env_number("LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS") == 60.0
    assert environment.env_flag("LIGHTNING_CQK_DEBUG") is False
    assert environment.env_choice("LIGHTNING_CQK_SWEEP_START") == "fork"
    assert environment.env_modules("LIGHTNING_CQK_TRUSTED_MODULES") == ()
    assert environment.env_path("LIGHTNING_CQK_SHARED_DATA") is None
    monkeypatch.setenv("LIGHTNING_CQK_LONG_RUN_HOURS", " ")
    assert environment.env_number("LIGHTNING_CQK_LONG_RUN_HOURS") == 24.0
    monkeypatch.setenv("LIGHTNING_CQK_LONG_RUN_HOURS", "0")
    assert limit_hours_from_env() == 0.0
    monkeypatch.setenv("LIGHTNING_CQK_DEBUG", "On")
    assert pop_debug(["fit"]) == (True, ["fit"])
    monkeypatch.setenv("LIGHTNING_CQK_TRUSTED_MODULES", "mylab, lab.callbacks,")
    assert environment.env_modules("LIGHTNING_CQK_TRUSTED_MODULES") == ("mylab", "lab.callbacks")


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_a_malformed_value_is_no_import_time_traceback():
    done = _child(
        "import lightning_cqk.study.run.runner, lightning_cqk.study.run.worker, lightning_cqk.cli.error_report",
        LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS="x",
        LIGHTNING_CQK_SWEEP_START="spawn",
        LIGHTNING_CQK_DEBUG="maybe",
    )
    assert done.returncode == 0, done.stderr


def test_a_malformed_debug_flag_is_one_paragraph_from_the_command_line():
    done = _child(
        "import sys; sys.argv = ['lightning_cqk', 'fit', '--help']; from lightning_cqk.cli.main import main; main()",
        LIGHTNING_CQK_DEBUG="maybe",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("lightning_cqk: the environment variable LIGHTNING_CQK_DEBUG='maybe' is not one of")


def test_a_malformed_progress_interval_is_refused_when_a_sweep_starts(monkeypatch):
    from lightning_cqk.study.run import runner

    monkeypatch.setenv("LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS", "x")
    with pytest.raises(EnvironmentValueError, match="LIGHTNING_CQK_SWEEP_PROGRESS_SECONDS='x'"):
        runner.Progress.__init__(object.__new__(runner.Progress), None, [], 1)


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to string constants (`X_ENV = "LIGHTNING_CQK_..."`, tuples included)."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    if isinstance(t, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                        names[t.id] = v.value
    return names


def _environment_reads(path: Path, root: Path = REPO) -> list[str]:
    """`os.environ.get(X)`, `os.getenv(X)` and `os.environ[X]` (read) of a LIGHTNING_CQK_* name in one file."""
    tree = ast.parse(path.read_text())
    strings = _module_strings(tree)

    def value(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return strings.get(node.id, "") if isinstance(node, ast.Name) else ""

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if ast.unparse(node.value) in ("os.environ", "environ"):
                key = node.slice
        if key is not None and value(key).startswith("LIGHTNING_CQK_"):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_module_reads_a_variable_around_the_helper():
    reads = [r for p in PACKAGE.rglob("*.py") if p.name != "environment.py" for r in _environment_reads(p)]
    assert not reads, f"read without lightning_cqk/environment.py: {reads}"


def test_the_checker_sees_a_read_around_the_helper(tmp_path):
    """The check above can fail: the old reads (issue 45's triggers) are found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        'import os\nX_ENV = "LIGHTNING_CQK_DEBUG"\na = os.environ.get(X_ENV)\nb = os.environ["LIGHTNING_CQK_LOG_DIR"]\n'
        'os.environ[X_ENV] = "1"\n'
    )
    assert len(_environment_reads(probe, root=tmp_path)) == 2


def test_every_variable_the_package_names_is_declared():
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"\bLIGHTNING_CQK_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - set(VARIABLES) == set(), "named in lightning_cqk/ but not declared in environment.VARIABLES"
