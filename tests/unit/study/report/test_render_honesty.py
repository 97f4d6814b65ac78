"""Honest reports (issue 31 item 4), on the committed results: each report names the corpus its runs train on and,
where the paper's corpus differs, E both ways; a rate inherited from another level's grid makes its claims
configuration-limited; "near standard" is judged by TOST against a declared margin."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lightning_cqk.study.design.claim import parse_claim
from lightning_cqk.study.design.units import convert_pct
from lightning_cqk.study.judge.group_estimates import training_corpora, untuned_groups, verdicts
from lightning_cqk.study.report.report_read import collect

RESULTS = Path(__file__).resolve().parents[4] / "docs" / "results"


@pytest.fixture(scope="module")
def judged():
    """study -> {claim: Judgement} of the committed coupling, corpus and deconstruction results."""
    out = {}
    for study in ("coupling", "corpus", "deconstruction"):
        if not (RESULTS / study / "study.json").is_file():
            pytest.skip(f"no committed results of {study}")
        out[study] = {j.name: j for j in verdicts(collect(RESULTS / study))}
    return out


def test_e_is_shown_with_both_corpora_where_the_runs_do_not_train_on_the_papers(judged):
    j = judged["coupling"]["leapfrog-vs-standard"]
    assert (j.e_corpus, j.train_corpus) == ("wikitext", "python_docs")
    assert j.converted_pct == pytest.approx(convert_pct(-6.6, "token_ppl", "gpt2", "wikitext")[0])
    assert j.train_pct == pytest.approx(100 * math.expm1(math.log1p(-0.066) / 3.5315))  # -1.91% per byte
    assert round(j.converted_pct, 2) == -1.49 and round(j.train_pct, 2) == -1.91
    same = judged["corpus"]["coupled-vs-standard-pubmed"]  # trains on PubMed, E from PubMed: one E
    assert (same.e_corpus, same.train_corpus) == ("pubmed", "pubmed") and math.isnan(same.train_pct)


def test_the_verdict_under_the_training_corpus_is_kept_when_it_differs(judged):
    for j in judged["coupling"].values():
        if math.isfinite(j.train_pct):
            assert j.train_verdict == "" or not j.train_verdict.startswith(j.verdict.split(";")[0])


def test_a_rate_chosen_at_another_level_makes_the_claim_configuration_limited():
    data = collect(RESULTS / "corpus")
    untuned = untuned_groups(data)
    assert "corpus=wikitext, inherited" in untuned["pubmed-standard"]
    assert "wikitext-standard" not in untuned and "wikitext-coupled" not in untuned  # their own grid
    claims = {j.name: j for j in verdicts(data)}
    assert "pubmed-standard: rate chosen by the grid at corpus=wikitext" in claims["coupled-vs-standard-pubmed"].limited
    assert not claims["coupled-vs-standard-wikitext"].limited
    claims = [parse_claim(c) for c in data.manifest["spec"]["claims"]]
    assert training_corpora(data, claims)["coupled-vs-standard-web"] == "web"


def test_near_standard_is_an_equivalence_claim(judged):
    j = judged["deconstruction"]["approximate-hybrid-near-standard"]
    assert j.expect == "same" and j.margin_pct == 1.0
    assert j.verdict == "not equivalent"  # +13.6% [+8.7, +18.7] is not within ±1%
