"""`lightning_cqk report`: its numbers equal the TensorBoard scalars they come from, and its figures are written."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from lightning_cqk.cli import main
from lightning_cqk.downstream.glue_table import FORMAT
from lightning_cqk.sweep.report import read_scalars, report_command, write_report
from lightning_cqk.sweep.stats import welch_t_test

# final val/ppl per seed (the last of three validations); the curve before it is arbitrary
FINAL = {"base": [20.5, 21.25, 19.75], "var": [18.0, 18.5, 19.75]}
RESUMED = 22.0  # base-s1's final val/ppl as re-logged by its resumed attempt (the value the report must use)
EXPECTED = {"base": [RESUMED, 21.25, 19.75], "var": FINAL["var"]}
STEPS = (10, 20, 30)
TOKENS_PER_STEP = 512


def f32(x: float) -> float:
    return float(np.float32(x))  # TensorBoard stores scalars as float32


def _write_run(run_dir: Path, group: str, seed: int, final: float) -> None:
    with SummaryWriter(str(run_dir)) as w:
        for i, step in enumerate(STEPS):
            ppl = final + 10.0 * (len(STEPS) - 1 - i) + seed
            ppl = final if step == STEPS[-1] else ppl
            w.add_scalar("val/ppl", ppl, step, walltime=1000.0 + step)
            w.add_scalar("val/bpb", math.log2(ppl) / 3.0, step, walltime=1000.0 + step)
            w.add_scalar("train/grad_norm/total", 1.0 / (i + 1) + seed, step, walltime=1000.0 + step)
            w.add_scalar("train/spikes", float(i), step, walltime=1000.0 + step)
    budget = {"tokens": STEPS[-1] * TOKENS_PER_STEP, "flops": 3.0e9 * seed, "wallclock": 10.0 * seed + 1.0}
    (run_dir / "budget.json").write_text(json.dumps({**budget, "steps": STEPS[-1], "tokens_per_step": TOKENS_PER_STEP}))


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    sweep = tmp_path / "toy-cpu"
    runs = []
    for group, finals in FINAL.items():
        for seed, final in enumerate(finals, start=1):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "group": group, "seed": seed, "levels": {"arm": group}})
            _write_run(sweep / name, group, seed, final)
    runs.append({"name": "var-s4", "group": "var", "seed": 4, "levels": {"arm": "var"}})  # never ran
    # base-s1 was killed after its last validation and resumed: the resumed attempt re-logged step 30 (last wins)
    with SummaryWriter(str(sweep / "base-s1"), filename_suffix=".resumed") as w:
        w.add_scalar("val/ppl", RESUMED, 30, walltime=5000.0)
    spec = {
        "study": "toy",
        "title": "Toy study",
        "metric": "val/ppl",
        "baseline": {"arm": "base"},
        "published": {"source": "a paper", "values": {"base": 10.0, "var": 9.0}, "deltas": {}},
    }
    (sweep / "manifest.json").write_text(json.dumps({"study": "toy", "profile": "cpu", "spec": spec, "runs": runs}))
    return sweep


def test_read_scalars_keeps_the_last_write_of_a_step(sweep_dir: Path):
    scalars = read_scalars(sweep_dir / "base-s1")
    assert [s for s, _ in scalars["val/ppl"]] == list(STEPS)
    assert scalars["val/ppl"][-1][1] == RESUMED


def test_table_numbers_equal_the_scalars(sweep_dir: Path, capsys):
    paths = write_report(sweep_dir)
    rows = {r["group"]: r for r in csv.DictReader(paths["csv"].open())}
    base = [f32(x) for x in EXPECTED["base"]]
    var = [f32(x) for x in EXPECTED["var"]]
    for group, values in (("base", base), ("var", var)):
        row = rows[group]
        assert int(row["seeds"]) == 3
        assert float(row["val/ppl_mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert float(row["val/ppl_std"]) == pytest.approx(statistics.stdev(values), rel=1e-12)
        # base-s1's resumed attempt re-logged only val/ppl at step 30: its bpb stays the first attempt's
        bpb = [f32(math.log2(v) / 3.0) for v in FINAL[group]]
        assert float(row["val/bpb_mean"]) == pytest.approx(statistics.fmean(bpb), rel=1e-6)
        assert float(row["tokens"]) == STEPS[-1] * TOKENS_PER_STEP
        assert float(row["flops"]) == pytest.approx(3.0e9 * 2)  # mean over seeds 1, 2, 3
        assert float(row["wallclock"]) == pytest.approx(21.0)
    var_row = rows["var"]
    assert float(var_row["delta_pct"]) == pytest.approx(100 * (statistics.fmean(var) / statistics.fmean(base) - 1))
    assert float(var_row["seed_var_ratio"]) == pytest.approx(statistics.variance(var) / statistics.variance(base))
    assert float(var_row["p_welch"]) == pytest.approx(welch_t_test(var, base)[2], rel=1e-12)
    assert 0.0 < float(var_row["p_welch"]) < 1.0
    assert float(var_row["published"]) == 9.0 and float(var_row["published_delta_pct"]) == pytest.approx(-10.0)
    assert math.isnan(float(rows["base"]["p_welch"])) and rows["base"]["baseline"] == "base"
    out = capsys.readouterr().out
    assert "| var | 3 |" in out and "(baseline)" in out and "var-s4" in out  # the missing run is named
    assert f"{statistics.fmean(var):.2f} ± {statistics.stdev(var):.2f}" in paths["markdown"].read_text()


def test_figures_are_pngs(sweep_dir: Path):
    paths = write_report(sweep_dir, quiet=True)
    for name in ("val_curves", "stability", "ppl_vs_tokens"):
        data = paths[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_report_command_errors_clearly(tmp_path: Path):
    with pytest.raises(SystemExit, match="no manifest.json"):
        main(["report", str(tmp_path)])


def _glue_json(acc: float, checkpoint: str) -> dict:
    entry = {"status": "ok", "metrics": {"acc": {"mean": acc, "std": 0.0, "per_seed": [acc]}}, "score": acc}
    table = {"checkpoint": checkpoint, "tasks": {"rte": entry}, "average": acc, "average_over": ["rte"]}
    return {"format": FORMAT, **table}


def test_report_puts_glue_tables_side_by_side(sweep_dir: Path, tmp_path: Path, capsys):
    """glue.json files of the sweep's checkpoints, and of checkpoints named by --glue, become one GLUE section."""
    own = sweep_dir / "base-s1" / "checkpoints"
    own.mkdir(parents=True)
    (own / "glue.json").write_text(json.dumps(_glue_json(0.5, str(own / "last.ckpt"))))
    other = tmp_path / "elsewhere" / "coupled-tiny-s1" / "checkpoints"
    other.mkdir(parents=True)
    (other / "glue.json").write_text(json.dumps(_glue_json(0.625, str(other / "last.ckpt"))))

    report_command([str(sweep_dir), "--glue", str(other / "glue.json")])
    printed = capsys.readouterr().out
    assert "## GLUE" in printed
    assert "| RTE (acc) | 50.0 | 62.5 |" in printed
    glue_md = (sweep_dir / "report" / "glue.md").read_text()
    assert "| RTE (acc) | 50.0 | 62.5 |" in glue_md
    assert "| RTE (acc) |" in (sweep_dir / "report" / "toy.md").read_text()
    # report/ itself is never searched: a second report finds the same two tables, not a copy of them
    report_command([str(sweep_dir), "--glue", str(other / "glue.json")])
    assert capsys.readouterr().out.count("| RTE (acc) |") == 1
