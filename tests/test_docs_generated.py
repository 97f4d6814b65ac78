"""Docs that cannot go stale: the generated sections of docs/backends.md and README.md match the code and results,
and the defaults written outside the options dataclasses (configs/attention/<backend>.yaml, the bracketed defaults
of the attention modules' docstrings) equal the dataclass defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_cqk import attention
from lightning_cqk.attention.transform import transform_registry
from lightning_cqk.contract.backends_table import BEGIN, END, docstring_defaults, markdown, option_defaults

REPO = Path(__file__).resolve().parents[1]


def _section(text: str, begin: str, end: str) -> str:
    assert begin in text and end in text, f"markers missing: {begin} ... {end}"
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end


def test_backends_page_is_current(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    committed = _section((REPO / "docs" / "backends.md").read_text(), BEGIN, END)
    assert committed.strip() == markdown().strip(), (
        "docs/backends.md is stale; regenerate it with: lightning_cqk attention --markdown --write docs/backends.md"
    )


def test_the_results_claims_table_is_current(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)  # the studies' papers come from configs/ablations/<study>.yaml
    from lightning_cqk.study.report.claims_table import BEGIN as CB
    from lightning_cqk.study.report.claims_table import END as CE
    from lightning_cqk.study.report.claims_table import claims_markdown

    committed = _section((REPO / "docs" / "results" / "README.md").read_text(), CB, CE)
    assert committed.strip() == claims_markdown(REPO / "docs" / "results", link_root=".").strip(), (
        "docs/results/README.md's claims table is stale; regenerate it with: "
        "lightning_cqk claims-table --write docs/results/README.md"
    )


def test_the_environment_table_is_current():
    """docs/environment.md's table of the LIGHTNING_CQK_* variables is lightning_cqk/environment.py's declaration."""
    from lightning_cqk.environment import BEGIN as EB
    from lightning_cqk.environment import END as EE
    from lightning_cqk.environment import markdown_table

    committed = _section((REPO / "docs" / "environment.md").read_text(), EB, EE)
    assert committed.strip() == markdown_table().strip(), (
        "docs/environment.md's table is stale; regenerate it from `python -m lightning_cqk.environment`"
    )


def _owners():
    for name in attention.available():
        cls = attention.get_attention(name)
        yield name, cls, cls.Options
    for kind, cls in transform_registry().items():
        yield f"qk_transform {kind}", cls, cls.Options


@pytest.mark.parametrize("name,owner,options", list(_owners()), ids=lambda x: x if isinstance(x, str) else "")
def test_docstrings_write_no_defaults(name, owner, options):
    """A default lives in the options dataclass only; the docstrings' option lines carry meaning and [NS] tags."""
    assert docstring_defaults(owner, options) == {}, f"{name}: defaults written in a docstring (drop the brackets)"


def test_attention_configs_list_the_dataclass_defaults():
    """configs/attention/<backend>.yaml lists each option at its default; every fragment names real options."""
    transforms = transform_registry()
    for path in sorted((REPO / "configs" / "attention").glob("*.yaml")):
        fields = yaml.safe_load(path.read_text())["model"]["config"]
        cls = attention.get_attention(fields.get("attention", "standard"))
        defaults = option_defaults(cls.Options)
        options = fields.get("attention_options") or {}
        unknown = sorted(set(options) - set(defaults))
        assert not unknown, f"{path.name}: options {unknown} are not fields of {cls.Options.__name__}"
        if path.stem == cls.name:  # the backend's own file: every option, at its default
            assert options == defaults, f"{path.name} differs from {cls.Options.__name__}'s defaults"
        transform = options.get("qk_transform")
        if isinstance(transform, dict) and path.stem == transform["kind"]:
            expected = option_defaults(transforms[transform["kind"]].Options)
            assert {k: v for k, v in transform.items() if k != "kind"} == expected, path.name


def test_every_committed_report_is_what_report_recomputes_from_its_committed_files(monkeypatch, tmp_path: Path):
    """`lightning_cqk report docs/results/<study>` on a copy of the folder (siblings included: the shared-run notes
    read them) writes each study's Markdown, CSV and claims.csv exactly as committed (figures left out for time)."""
    import shutil

    import lightning_cqk.study.report.figures
    from lightning_cqk.study.report.report_command import write_report

    results = REPO / "docs" / "results"
    studies = sorted(p.parent.name for p in results.glob("*/study.json"))
    if not studies:
        pytest.skip("no committed study results")
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    monkeypatch.setattr(lightning_cqk.study.report.figures, "figures", lambda *args, **kwargs: [])
    for study in studies:
        write_report(copy / study, quiet=True)
        for name in (f"{study}.md", f"{study}.csv", "claims.csv"):
            assert (copy / study / name).read_text() == (results / study / name).read_text(), f"{study}/{name}"


@pytest.mark.slow
def test_a_report_of_a_committed_results_folder_leaves_every_file_as_committed(tmp_path: Path):
    """Issue 35 item 7: `lightning_cqk report docs/results/coupling` redrew stability.png from committed files that
    do not hold the gradient norms it plots, leaving the checkout dirty. Figures found there are kept as committed."""
    import shutil

    from lightning_cqk.study.report.report_command import write_report

    results = REPO / "docs" / "results"
    if not (results / "coupling" / "study.json").is_file():
        pytest.skip("no committed coupling results")
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    write_report(copy / "coupling", quiet=True)
    committed = sorted(p.name for p in (results / "coupling").iterdir())
    assert sorted(p.name for p in (copy / "coupling").iterdir()) == committed
    for name in committed:
        assert (copy / "coupling" / name).read_bytes() == (results / "coupling" / name).read_bytes(), name
