"""The package stands on its own: a wheel built from the tree, installed in a fresh virtualenv, runs the quickstart
and a sweep dry-run from an empty directory, finding its configs as package data (`lightning_cqk/files/resources.py`).

The new virtualenv gets its dependencies from the running interpreter's site-packages (a `.pth` line), so the test
needs no network; the package itself must come from the wheel (asserted: `lightning_cqk.__file__` lies in the new
virtualenv, not in this checkout or an editable install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TREE = ("lightning_cqk", "configs", "callbacks", "setup.py", "pyproject.toml", "README.md")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 120) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the wheel of this tree installed (dependencies: this interpreter's site-packages)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in TREE:  # a copy: building writes build/ and *.egg-info beside the sources
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
        root,
        env,
    )
    wheels = list(dist.glob("lightning_cqk-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    python = _venv_with_shared_deps(venv, env)
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheels[0])], root, env
    )
    return venv


def _venv_with_shared_deps(venv: Path, env: dict[str, str]) -> Path:
    """A virtualenv without pip whose dependencies are this interpreter's site-packages (a `.pth` line)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent, env)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv.parent, env)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib.strip()) / "shared_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return python


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", LITDATA_DISABLE_VERSION_CHECK="1")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.slow
def test_wheel_runs_quickstart_and_sweep_dry_run_from_an_empty_directory(wheel_venv: Path, tmp_path: Path):
    env = _clean_env(wheel_venv)
    work = tmp_path / "empty"
    work.mkdir()
    where = _run(
        [str(wheel_venv / "bin" / "python"), "-c", "import lightning_cqk; print(lightning_cqk.__file__)"], work, env
    )
    assert Path(where.strip()).resolve().is_relative_to(wheel_venv.resolve()), where  # the wheel, not a checkout
    cli = str(wheel_venv / "bin" / "lightning_cqk")
    out = _run(
        [
            cli,
            "fit",
            "--config",
            "configs/quickstart.yaml",
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=1",
            "--trainer.val_check_interval=2",
            "--data.seq_len=32",
            "--data.batch_size=2",
            "--data.val_batch_size=2",
            "--trainer.enable_progress_bar=false",
        ],
        work,
        env,
        timeout=180,
    )
    assert "Run summary" in out
    assert (work / "runs" / "quickstart" / "standard-tiny-s1337" / "checkpoints" / "last.ckpt").is_file()
    out = _run([cli, "sweep", "configs/ablations/coupling.yaml", "--profile", "cpu", "--dry-run"], work, env)
    assert "coupled-leapfrog-s1" in out and str(wheel_venv) in out  # the shipped spec's configs, by their path
    assert sorted(p.name for p in work.iterdir()) == ["data", "runs"]  # what the runs own, nothing else

    missing = subprocess.run(
        [cli, "fit", "--config", "configs/quickstrat.yaml"], cwd=work, env=env, capture_output=True, text=True
    )
    assert missing.returncode != 0 and "Did you mean configs/quickstart.yaml" in missing.stderr, missing.stderr[-2000:]

    # An editable install (what `make install` does) finds the configs in its source tree from anywhere too.
    src = wheel_venv.parent / "src"
    editable = _venv_with_shared_deps(tmp_path / "editable", env)
    pip = [sys.executable, "-m", "pip", "--python", str(editable), "install", "-q", "--no-deps", "--no-build-isolation"]
    _run([*pip, "-e", str(src)], tmp_path, env)
    probe = (
        "from lightning_cqk.files.resources import find_config; print(find_config('configs/ablations/coupling.yaml'))"
    )
    found = _run([str(editable), "-c", probe], work, env)
    assert Path(found.strip().splitlines()[-1]) == src / "configs" / "ablations" / "coupling.yaml", found
