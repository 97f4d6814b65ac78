"""`lightning_cqk report` is never half old and half new (issue 25, class 6): a real `report` subprocess SIGKILLed
after its tables and one figure, or between the two renames of the fallback swap, leaves the previous complete report
(or none); on a full disk (a small tmpfs) or past a file-size limit (RLIMIT_FSIZE: EFBIG) it says so in one paragraph,
leaves the previous report byte for byte and no partial or 0-byte file; files that no report wrote are kept, and a
folder that holds no report is never replaced."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from lightning_cqk.cli import main
from lightning_cqk.study.report import report_folder
from lightning_cqk.study.report.report_command import write_report

REPO = Path(__file__).resolve().parents[3]
FINALS = {"base": [20.0, 21.0], "var": [18.0, 18.5]}
SPEC = {
    "study": "toy",
    "metric": "val/ppl",
    "baseline": {"arm": "base"},
    "claims": [{"name": "var-helps", "group": "var", "vs": "base", "expect": "lower"}],
}


def _sweep(root: Path) -> Path:
    sweep = root / "toy-cpu"
    runs = []
    for group, finals in FINALS.items():
        for seed, final in enumerate(finals, start=1):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "group": group, "seed": seed, "levels": {"arm": group}})
            with SummaryWriter(str(sweep / name)) as w:
                for step in (10, 20):
                    ppl = final + (20 - step)
                    w.add_scalar("val/ppl", ppl, step, walltime=1000.0 + step)
                    w.add_scalar("val/bpb", ppl / 10, step, walltime=1000.0 + step)
                    w.add_scalar("train/grad_norm/total", 1.0, step, walltime=1000.0 + step)
                    w.add_scalar("train/spikes", 0.0, step, walltime=1000.0 + step)
            budget = {"tokens": 20 * 512, "flops": 1e9, "wallclock": 5.0, "steps": 20, "tokens_per_step": 512}
            (sweep / name / "budget.json").write_text(json.dumps(budget))
    (sweep / "manifest.json").write_text(json.dumps({"study": "toy", "profile": "cpu", "spec": SPEC, "runs": runs}))
    return sweep


def _change_results(sweep: Path) -> None:
    """A resumed attempt of base-s1 re-logs its final step with another value: the next report's tables differ."""
    with SummaryWriter(str(sweep / "base-s1"), filename_suffix=".resumed") as w:
        w.add_scalar("val/ppl", 30.0, 20, walltime=9000.0)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


def _report(sweep: Path, out: Path, before: str = "", **popen) -> subprocess.CompletedProcess:
    """`lightning_cqk report SWEEP --output OUT` in a real subprocess, after the Python lines `before`."""
    script = (
        before + f"\nfrom lightning_cqk.cli import main\nmain(['report', {str(sweep)!r}, '--output', {str(out)!r}])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-c", script]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, **popen)


KILL_AFTER_FIRST_FIGURE = textwrap.dedent(
    """
    import os, signal
    import matplotlib.figure
    _save = matplotlib.figure.Figure.savefig
    def savefig(self, *args, **kwargs):  # the tables are written; one figure is, then the process is SIGKILLed
        _save(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    matplotlib.figure.Figure.savefig = savefig
    """
)


@pytest.mark.slow
def test_a_report_killed_mid_write_leaves_the_previous_one_whole(tmp_path: Path):
    sweep = _sweep(tmp_path)
    out = tmp_path / "report"
    write_report(sweep, out, quiet=True)
    (out / "README.md").write_text("hand-written notes beside the report\n")
    previous = _snapshot(out)
    assert {"toy.md", "toy.csv", "claims.csv", "val_curves.png", "README.md", ".report.json"} <= set(previous)
    _change_results(sweep)
    done = _report(sweep, out, KILL_AFTER_FIRST_FIGURE)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert _snapshot(out) == previous, "a killed report changed the previous one"
    assert [p.name for p in tmp_path.glob(".report.new-*")], "the killed report's folder is the only trace"

    write_report(sweep, out, quiet=True)  # the next report replaces it whole and removes the leftover
    now = _snapshot(out)
    assert now["toy.md"] != previous["toy.md"] and now["toy.csv"] != previous["toy.csv"]
    assert now["README.md"] == previous["README.md"], "a file no report wrote is kept"
    assert not list(tmp_path.glob(".report.*")), "leftovers of the killed report are removed"


@pytest.mark.slow
def test_a_report_killed_between_the_renames_of_the_fallback_swap(tmp_path: Path):
    """Without RENAME_EXCHANGE the swap is two renames; killed between them, no report is there (never a mix), and
    the next report first puts the previous one back."""
    sweep = _sweep(tmp_path)
    out = tmp_path / "report"
    write_report(sweep, out, quiet=True)
    previous = _snapshot(out)
    _change_results(sweep)
    kill_between = textwrap.dedent(
        """
        import os, signal
        from lightning_cqk.study.report import report_folder
        report_folder.exchange = lambda a, b: False
        _rename = os.rename
        def rename(src, dst):
            if ".report.new-" in str(src):  # the old report is moved aside; kill before the new one moves in
                os.kill(os.getpid(), signal.SIGKILL)
            _rename(src, dst)
        os.rename = rename
        """
    )
    done = _report(sweep, out, kill_between)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    (aside,) = tmp_path.glob(".report.old-*")
    assert _snapshot(aside) == previous
    report_folder.recover(out)
    assert _snapshot(out) == previous and not list(tmp_path.glob(".report.*"))


def _assert_refused_cleanly(done: subprocess.CompletedProcess, out: Path, previous: dict, words: str) -> None:
    assert done.returncode == 1, done.stderr
    message = done.stderr.strip()
    assert message.startswith(f"lightning_cqk report: could not write the report into {out} ({words}"), message
    assert "The previous report there is unchanged (the partial new one was removed)" in message
    assert "--output <folder on another disk>" in message
    assert "Traceback" not in done.stderr and "\n" not in message
    assert _snapshot(out) == previous
    assert not list(out.parent.glob(f".{out.name}.*")), "no partial report is left beside it"
    assert all(content for content in _snapshot(out).values()), "no 0-byte file"


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err}); test_a_report_past_a_file_size_limit covers the same path")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow
def test_a_report_on_a_full_disk(tmp_path: Path, small_tmpfs: Path):
    sweep = _sweep(tmp_path)
    out = small_tmpfs / "report"
    write_report(sweep, out, quiet=True)
    previous = _snapshot(out)
    _change_results(sweep)
    stat = os.statvfs(small_tmpfs)
    (small_tmpfs / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 16 * 1024))  # 16 KiB left
    done = _report(sweep, out)
    _assert_refused_cleanly(done, out, previous, "No space left on device, ENOSPC")
    (small_tmpfs / "filler").unlink()
    write_report(sweep, out, quiet=True)  # with space again, the same report is written
    assert _snapshot(out)["toy.md"] != previous["toy.md"]


@pytest.mark.slow
def test_a_report_past_a_file_size_limit(tmp_path: Path):
    """RLIMIT_FSIZE in the child (SIGXFSZ ignored): a write past 8 KiB fails with EFBIG, as on a full disk."""
    sweep = _sweep(tmp_path)
    out = tmp_path / "report"
    write_report(sweep, out, quiet=True)
    previous = _snapshot(out)
    _change_results(sweep)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024, 8 * 1024))

    done = _report(sweep, out, preexec_fn=limit)
    _assert_refused_cleanly(done, out, previous, "File too large, EFBIG")


def test_a_folder_without_a_report_is_never_replaced(tmp_path: Path):
    sweep = _sweep(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit) as err:
        main(["report", str(sweep), "--output", str(work)])
    message = str(err.value.code)
    assert f"{work} holds notes.txt and no report: the report replaces its folder as a whole" in message
    assert f"lightning_cqk report {sweep} --output <new folder>" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy-cpu", "work"]
    with pytest.raises(SystemExit, match="toy-cpu holds base-s1, base-s2, manifest.json"):
        main(["report", str(sweep), "--output", str(sweep)])  # the sweep directory itself
    assert (sweep / "manifest.json").is_file()


def test_a_report_from_before_the_record_keeps_foreign_files_and_drops_its_own(tmp_path: Path):
    """A committed report (docs/results/<study>/) written before `.report.json` existed: its tables and figures are
    the report's (replaced whole, a figure it no longer makes goes), its README.md is not (kept)."""
    sweep = _sweep(tmp_path)
    out = tmp_path / "results" / "toy"
    out.mkdir(parents=True)
    for name in ("toy.md", "toy.csv", "claims.csv", "old_figure.png"):
        (out / name).write_text("from an older report\n")
    (out / "README.md").write_text("notes\n")
    write_report(sweep, out, quiet=True)
    names = set(_snapshot(out))
    assert "old_figure.png" not in names and (out / "README.md").read_text() == "notes\n"
    assert json.loads((out / ".report.json").read_text())["files"] == sorted(names - {"README.md", ".report.json"})
    assert "from an older report" not in (out / "toy.md").read_text()
    shutil.rmtree(out)
