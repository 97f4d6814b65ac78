"""The docs say what is true (issue 26): every relative link and #anchor of README.md and docs/**/*.md resolves, and
the numbers the docs quote that are generated elsewhere (run counts, wall-time estimates, study counts, code
revisions) match their source. Also the small front-door fixes: no machine paths, task YAMLs with aggregation, a
pointer from a recipe's name to its config file, one backend's options on request."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.cli import main
from lightning_cqk.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()


# ------------------------------------------------------------------------------------------------------ links
def _without_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (lower case, punctuation dropped, spaces to '-', -1 for repeats)."""
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Every relative link of `page` whose file does not exist, or whose #anchor is no heading of that file."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _without_code(page.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    assert not broken_links(page), broken_links(page)


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path: Path):
    (tmp_path / "a.md").write_text("# A title\n\n## The papers' corpora\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "# B\n[ok](a.md#the-papers-corpora) [self](#b) [web](https://x.org/#y) `[code](nowhere.md)`\n"
        "[no](missing.md) [bad](a.md#nowhere) [code block heading](a.md#not-a-heading)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "a.md#nowhere: no heading #nowhere in a.md",
        "a.md#not-a-heading: no heading #not-a-heading in a.md",
    ]


# ------------------------------------------------------------------------------------------ generated numbers
@pytest.fixture(scope="module")
def estimates() -> dict[str, tuple[int, list]]:
    """{study: (its cpu profile's jobs, the dry-run's RunEstimate of each run)} from the specs and
    study/design/cost_estimate.py."""
    import os

    from lightning_cqk.study.design.cost_estimate import estimate_runs
    from lightning_cqk.study.design.spec import expand

    os.environ.setdefault("LIGHTNING_CQK_SHARED_DATA", str(REPO.parent / "shared" / "data"))
    out = {}
    for spec in sorted((REPO / "configs" / "ablations").glob("*.yaml")):
        sweep = expand(spec, "cpu", REPO / "runs" / "never-written")
        out[spec.stem] = (sweep.jobs, estimate_runs(sweep, "fork"))
    return out


@pytest.fixture(scope="module")
def studies(estimates) -> dict[str, tuple[int, float]]:
    """{study: (cpu runs, dry-run estimate of its wall time in minutes)}."""
    from lightning_cqk.study.design.cost_estimate import study_seconds

    return {study: (len(runs), study_seconds(runs, jobs, "fork") / 60) for study, (jobs, runs) in estimates.items()}


def test_the_estimate_is_calibrated_to_the_committed_studies(estimates):
    """Issue 43 item 6: the cost model's constants are the least-squares fit to every computed run of the committed
    studies (study/design/cost_calibration.py), and with them each study's predicted wall is within 15% of its
    measured one (study.json), on its own runs."""
    from lightning_cqk.study.design import cost_estimate
    from lightning_cqk.study.design.cost_calibration import TOLERANCE, calibrate, committed_studies

    committed = committed_studies(REPO / "docs" / "results")
    assert {s.study for s in committed} <= set(estimates)
    calibration = calibrate(committed, lambda study: estimates[study.study][1])
    assert calibration.constants == cost_estimate.CALIBRATED, "refit: put calibrate()'s constants in cost_estimate"
    far = {t.study: (round(t.predicted_min, 1), round(t.measured_min, 1)) for t in calibration.studies}
    assert all(abs(t.error) <= TOLERANCE for t in calibration.studies), f"predicted vs measured minutes: {far}"


def test_the_studies_table_quotes_each_studys_runs_and_estimate(studies):
    text = (REPO / "docs" / "studies-and-reports.md").read_text()
    quoted = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^\| `(\w+)`(?: \(default\))? \|(?:[^|\n]*\|){2} (\d+)[^|\n]*\| (\d+) \|", text, re.M)}  # fmt: skip
    assert set(quoted) == set(studies), "every study has a row, and only studies"
    for study, (runs, minutes) in studies.items():
        assert quoted[study] == (runs, round(minutes)), f"{study}: docs {quoted[study]}, specs {runs, round(minutes)}"
    hours, word = re.search(r"([\d.]+) h for all (\w+)\)", text).groups()
    assert word == WORDS[len(studies)] and float(hours) == round(sum(m for _, m in studies.values()) / 60, 1)


def test_the_readme_quotes_the_default_study_and_the_whole_set(studies):
    text = (REPO / "README.md").read_text()
    runs, minutes = re.search(r"coupling\.yaml --profile cpu\s+# 3\. a study \((\d+) runs, ~(\d+) min\)", text).groups()
    assert (int(runs), int(minutes)) == (studies["coupling"][0], round(studies["coupling"][1]))
    hours = re.search(r"make ablations STUDY=all` \(about ([\d.]+) hours", text).group(1)
    assert float(hours) == round(sum(m for _, m in studies.values()) / 60, 1)


def test_the_results_index_quotes_each_reports_runs_estimate_and_revision(studies):
    """Each row quotes the runs its committed report was made with (study.json) and, where the spec has changed since
    (a rerun pending), the current spec's runs and estimate; the estimate in parentheses is the one of its time."""
    import json

    text = (REPO / "docs" / "results" / "README.md").read_text()
    lines = re.findall(r"^\| \[\w+\]\(\w+/\) \|.*$", text, re.M)
    rows = [re.match(r"^\| \[(\w+)\]\(\w+/\) \| (\d+)[^|]*\| [^|(]*\((\d+)\) \| ([0-9a-f, ]+) \|", x) for x in lines]
    assert all(rows), [x for x, r in zip(lines, rows, strict=True) if not r]
    assert {r.group(1) for r in rows} == set(studies)
    for line, row in zip(lines, rows, strict=True):
        study, runs, _, code = row.groups()
        study_json = REPO / "docs" / "results" / study / "study.json"
        if study_json.is_file():
            made_with = len(json.loads(study_json.read_text())["runs"])
            assert int(runs) == made_with, f"{study}: the index says {runs} runs, its report was made with {made_with}"
            now_runs, now_minutes = studies[study][0], round(studies[study][1])
            if made_with != now_runs:  # the spec changed since: the rerun it plans is named
                assert f"current spec: {now_runs} runs, ~{now_minutes} min" in line, (study, now_runs, now_minutes)
        else:  # a report of an earlier spec (no committed results): the index must say so
            assert "made with the earlier specs" in text, f"{study}: its report predates the spec; say so"
        report = (REPO / "docs" / "results" / study / f"{study}.md").read_text()
        code_line = re.search(r"^Code: (.*)$", report, re.M).group(1)
        for revision in code.split(", "):
            assert revision in code_line, f"{study}: index names {revision}, the report says {code_line!r}"
        readme = (REPO / "docs" / "results" / study / "README.md").read_text()
        stated = re.search(r"Code: git ([0-9a-f]+)", readme)  # a study made by two revisions names both in words
        assert stated is None or stated.group(1) in code, f"{study}: its README names {stated.group(1)}"


def _measured_paired_sds(study: str) -> dict[str, float]:
    """{claim: paired sd (%) of its log metric} of a committed report's paired-t claims, from the 95% interval and n
    in claims.csv (half-width = t(0.975, n - 1) x sd / sqrt(n) in log space)."""
    import csv
    import math

    from scipy import stats

    out = {}
    with (REPO / "docs" / "results" / study / "claims.csv").open() as f:
        for row in csv.DictReader(f):
            if row["test"] != "paired t":
                continue
            n = int(row["n"])
            half = (math.log1p(float(row["ci_high_pct"]) / 100) - math.log1p(float(row["ci_low_pct"]) / 100)) / 2
            out[row["claim"]] = 100 * half * math.sqrt(n) / float(stats.t.ppf(0.975, n - 1))
    return out


@pytest.mark.parametrize("study", sorted(p.stem for p in (REPO / "configs" / "ablations").glob("*.yaml")))
def test_the_dry_runs_power_plan_uses_the_paired_sds_the_committed_report_measured(study: str):
    """A spec's `planning: sd_pct` names each judged claim with the paired sd its committed report measured (to 0.1),
    so `--dry-run` says what the study can detect; rerunning a study means updating its planning. A claim planned more
    conservatively says why (`sd_basis`) and is planned at no less than measured; a claim or control the spec no
    longer has is not planned. A claim whose committed verdict says its baseline was off its optimum (a reversed
    control: the coupling rerun) measured a mistuned comparison, not the design's: it keeps its plan, with a basis."""
    if not (REPO / "docs" / "results" / study / "claims.csv").is_file():
        pytest.skip(f"{study}: no committed claims.csv")
    spec = yaml.safe_load((REPO / "configs" / "ablations" / f"{study}.yaml").read_text())
    planned = spec["profiles"]["cpu"]
    sds = (planned.get("planning") or {}).get("sd_pct") or {}
    basis = (planned.get("planning") or {}).get("sd_basis") or {}
    control = planned.get("control") or spec.get("control")
    current = {c["name"] for c in planned.get("claims") or spec.get("claims") or []}
    current |= {f"control-{control['name']}"} if control else set()
    with (REPO / "docs" / "results" / study / "claims.csv").open() as f:
        verdicts = {row["claim"]: row["verdict"] for row in csv.DictReader(f)}
    for claim, sd in _measured_paired_sds(study).items():
        if claim not in current:
            continue
        assert claim in sds, f"{study}: planning sd_pct names no {claim} (measured {sd:.2f}%)"
        mistuned = "baseline off its optimum" in verdicts.get(claim, "") or "reversed" in verdicts.get(claim, "")
        if mistuned:
            assert claim in basis, f"{study}: {claim} measured against a baseline off its optimum: say why (sd_basis)"
        elif claim in basis:
            assert float(sds[claim]) >= sd - 0.051, f"{study}: {claim} planned {sds[claim]}% < measured {sd:.2f}%"
        else:
            assert abs(float(sds[claim]) - sd) <= 0.051, f"{study}: {claim} planned {sds[claim]}%, measured {sd:.2f}%"


def test_no_page_names_a_path_of_the_machine_that_wrote_it():
    for page in PAGES:
        found = re.findall(r"(?<![\w.])/(?:work|home|root|Users|tmp)/[\w./-]+", page.read_text())
        assert not found, f"{page.relative_to(REPO)}: {found}"


def test_the_readme_stays_short_and_names_the_cards_command():
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) < 12_000  # the full claims table lives in docs/results/README.md
    assert "lightning_cqk fit --config configs/pubmed.yaml" in text


# ------------------------------------------------------------------------------------------ front-door fixes
def test_the_task_yamls_of_the_evaluation_page_give_every_metric_its_aggregation():
    text = (REPO / "docs" / "evaluation.md").read_text()
    tasks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    tasks = [t for t in tasks if isinstance(t, dict) and "task" in t]
    assert len(tasks) >= 4
    registry = None
    try:
        import lm_eval.api.metrics  # noqa: F401  (registers the aggregations)
        from lm_eval.api.registry import AGGREGATION_REGISTRY as registry
    except ImportError:
        pass
    for task in tasks:
        for metric in task["metric_list"]:
            assert {"aggregation", "higher_is_better"} <= set(metric), f"{task['task']}: {metric}"
            assert registry is None or metric["aggregation"] in registry, metric


def test_bench_help_cites_no_issue_numbers():
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "bench" in out.stdout
    assert not re.search(r"\bissues? \d+", out.stdout, re.I), re.findall(r".*issues? \d+.*", out.stdout, re.I)


def test_a_recipes_name_as_backend_points_at_its_config_file(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    runs = f"--trainer.logger.init_args.save_dir={tmp_path}"
    with pytest.raises(ConfigError) as err:
        main(["fit", "--config", "configs/quickstart.yaml", "--model.config.attention", "gqa", runs])
    assert "--config configs/attention/gqa.yaml" in str(err.value) and "attention: standard" in str(err.value)
    with pytest.raises(ConfigError, match="Did you mean 'coupled'"):
        main(["attention", "cupled"])


def test_attention_with_a_name_shows_that_backends_options(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    main(["attention", "coupled"])
    out = capsys.readouterr().out
    assert out.startswith("coupled: ") and "steps = 1: integration steps" in out and "differential" not in out
    with pytest.raises(ConfigError, match="configs/attention/mqa.yaml"):
        main(["attention", "mqa"])
