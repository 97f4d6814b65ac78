"""Rendering a study's report (its last stage: lightning_cqk/study/report/report_command.py): the Markdown (verdicts
first, then the
group table, the control, the tuning grid, what ran), the CSV tables, and the cells the README's claims table
(study/report/claims_table.py) formats the same way."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from lightning_cqk.study.design.units import UNIT_NAMES
from lightning_cqk.study.judge.group_estimates import control_calibration, control_prediction, final, val_sampling_error
from lightning_cqk.study.judge.verdict import DETECTED, INTERIM, Judgement
from lightning_cqk.study.report.report_read import computed_once
from lightning_cqk.study.results_model import StudyData, TuningTable


def _fmt(x: float, spec: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _si(x: float) -> str:
    if math.isnan(x):
        return "–"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _pm(m: float, s: float, digits: int) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if not math.isnan(s) else f"{m:.{digits}f}"


def _ci(d: float, lo: float, hi: float) -> str:
    if math.isnan(d):
        return "–"
    return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" if not math.isnan(lo) else f"{d:+.2f}"


def published_cell(expect: str, pct: float, ratio: float, unit: str) -> str:
    """A claim's published number as the report and the README's claims table both print it: `-6.6% token PPL`
    (a change in the paper's own unit), `var ×8` (a seed-variance ratio), `×2.4 tokens` (a token multiplier), `–`
    where the paper gives none."""
    if expect.endswith("variance"):
        return f"var ×{ratio:g}" if math.isfinite(ratio) else "–"
    if expect == "token_multiplier":
        return f"×{ratio:g} tokens" if math.isfinite(ratio) else "–"
    if not math.isfinite(pct):
        return "–"
    return f"{pct:+.1f}% {UNIT_NAMES.get(unit, '(unit not declared)')}"


def _claim_lines(judgements: list[Judgement], spec: dict[str, Any], data: StudyData | None = None) -> list[str]:
    if not judgements:
        return ["No claims in the spec (`claims:`): no verdicts.", ""]
    k, level = judgements[0].family, judgements[0].level
    lines = [
        "| claim | expects | paper Δ % (its unit) | E: paper in ours, Δ % | our Δ % [95% CI] "
        f"| [{100 * (1 - level):.2f}% CI] | test (seeds) | Holm p vs 0 / vs E | detectable Δ % at α/k "
        "| seeds for E | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for j in judgements:
        paper = published_cell(j.expect, j.published_pct, j.published_ratio, j.published_unit)
        label = f"**control** {j.name}" if j.is_control else j.name
        if j.expect == "token_multiplier":  # Δ % is 100 (k - 1): k the tokens multiple worth the group
            what = f"{j.plus[0]} on the curve of {', '.join(j.minus)}"
        elif len(j.plus) > 1:  # a contrast: the log-metric of the plus groups minus that of the minus groups
            what = f"({' + '.join(j.plus)}) − ({' + '.join(j.minus)})"
        else:
            what = f"{j.plus[0]} vs {j.minus[0]}"
        margin = f" ({'±' if j.expect == 'same' else ''}{j.margin_pct:g}%)" if math.isfinite(j.margin_pct) else ""
        expects = j.expect + margin
        e_cell = _fmt(j.converted_pct, "+.2f")
        if j.is_control and math.isfinite(j.expected_pct):
            e_cell = f"{j.expected_pct:+.2f} (planted)"
        if j.variance is not None:
            v = j.variance
            ours = f"var ×{v.ratio:.2f} [{v.ci_low:.2f}, {v.ci_high:.2f}]" if math.isfinite(v.ratio) else "–"
            test, mde, vci = f"{v.test} ({v.n_a})", "–", "–"
        else:
            e = j.effect
            ours = _ci(e.delta_pct, e.ci_low_pct, e.ci_high_pct)
            div = f", {e.diverged} diverged" if e.diverged else ""
            test, mde = f"{e.test} ({e.n}{div})", _fmt(j.mde_pct, "+.2f")
            if math.isfinite(e.p_signflip):  # few seeds: the exact p beside the t-test's, which leans on normality
                test += f"; exact sign-flip p {e.p_signflip:.3g}"
            vci = f"[{j.v_low_pct:+.2f}, {j.v_high_pct:+.2f}]" if math.isfinite(j.v_low_pct) else "–"
        ps = _fmt(j.p_holm, ".3g") + (f" / {_fmt(j.p_holm_effect, '.3g')}" if math.isfinite(j.p_holm_effect) else "")
        need = "–" if not j.seeds_needed else ("> 200" if j.seeds_needed > 200 else str(j.seeds_needed))
        verdict = f"**{j.verdict}**" + (f" ({j.why})" if j.why else "")
        if j.limited:
            verdict += f"; *configuration-limited*: {j.limited}"
        lines.append(
            f"| {label}: {what} | {expects} | {paper} | {e_cell} | {ours} | {vci} | {test} | {ps} | {mde} "
            f"| {need} | {verdict} |"
        )
    lines.append("")
    lines.append(
        "Δ % is the change of the geometric mean of the metric over seeds (paired by seed: every level of a seed sees "
        "the same batches and starts from the same shared weights). E is the paper's change in our unit (byte-level "
        "perplexity) by the rule *same nats per byte*: a ratio r of perplexity per unit of b bytes is r^(1/b) per "
        "byte, with b measured on the paper's corpus with its tokenizer (lightning_cqk/study/design/units.py); a claim "
        "without a published number uses its declared smallest effect of interest. Verdicts are computed "
        f"(lightning_cqk/study/judge/verdict.py) from a family of k = {k} claims: their tests (against 0, against E, "
        "TOST, "
        "margins) Holm-adjusted together at α = 0.05, each step multiplied by the number of claims still open (a "
        "claim's two nulls cannot both be true: Shaffer); the detectable Δ (80% power) and the second interval are at "
        f"α/k = {level:.4g}, the level Holm gives a lone true effect. The control is outside the family: a one-sided "
        "paired t-test at α = 0.05, its own row's interval at 90%. Under 10 paired seeds the test cell also gives the "
        "exact sign-flip p against 0 (all 2^n sign patterns; its smallest value is 2/2^n, 0.0625 at 5 seeds), which "
        "does not lean on normality; the verdict reads the t-test's."
    )
    rules = [(j.name, j.converted_rule) for j in judgements if j.converted_rule and not j.is_control]
    if rules:
        lines.append("Conversions: " + "; ".join(f"{name}: {rule}" for name, rule in rules) + ".")
    lines += _corpus_lines(judgements)
    alt = [j for j in judgements if j.alt_verdict]
    if alt:
        lines.append(
            "Under the other rule (*same relative change of loss*) the verdict differs: "
            + "; ".join(f"{j.name}: E {j.alt_pct:+.2f}%, {j.alt_verdict}" for j in alt)
            + "."
        )
    noted = [(j.name, j.published_note) for j in judgements if j.published_note]
    if noted:
        lines.append("The paper's side, per claim: " + "; ".join(f"{name}: {note}" for name, note in noted) + ".")
    power = [j for j in judgements if not j.is_control and j.seeds_needed]
    if power:
        have = {j.name: (j.effect.n if j.effect else 0) for j in power}
        lines.append(
            f"Power: paired seeds that detect E at 80% power at α/k = {level:.4g} with the observed paired standard "
            "deviation: "
            + "; ".join(
                f"{j.name} {('more than 200' if j.seeds_needed > 200 else j.seeds_needed)} (ran {have[j.name]})"
                for j in power
            )
            + "."
        )
    skipped = spec.get("claims_not_in_profile") or []
    if skipped:
        lines.append(f"Not tested at this profile (a group it leaves out): {', '.join(skipped)}.")
    control = [j for j in judgements if j.is_control]
    if control:
        lines.append(_control_line(control[0], data))
    interim = [j for j in judgements if j.verdict.startswith(INTERIM)]
    if interim:
        lines.append(
            "**Interim report: no verdicts.** Not every planned seed has finished ("
            + "; ".join(f"{j.name} {j.seeds_done} of {j.seeds_planned}" for j in interim)
            + "). The number of seeds is fixed in the spec before the first run; a verdict after a look, with seeds "
            "added, would be optional stopping."
        )
    lines.append("")
    return lines


def _corpus_lines(judgements: list[Judgement]) -> list[str]:
    """What the runs train on and which corpus's bytes per unit convert E; where the two differ, E both ways and the
    verdict under the training corpus's when it differs (units.py: bytes per GPT-2 token and per word, measured)."""
    from lightning_cqk.study.design.units import CORPUS_NAMES

    with_e = [j for j in judgements if not j.is_control and j.e_corpus]
    trained = sorted({j.train_corpus for j in judgements if j.train_corpus})
    if not trained:
        return []
    names = ", ".join(CORPUS_NAMES.get(c, c) for c in trained)
    line = f"Corpus: the runs train on {names}."
    differ = [j for j in with_e if j.train_corpus and j.train_corpus != j.e_corpus]
    if with_e and not differ:
        line += " E converts each paper's change with the bytes per unit measured on that same corpus."
    if differ:
        line += (
            " E converts the paper's change with the bytes per unit of the paper's corpus; on the training corpus's "
            "own bytes per unit (lightning_cqk/study/design/units.py) it is: "
            + "; ".join(
                f"{j.name}: E {j.converted_pct:+.2f}% ({CORPUS_NAMES.get(j.e_corpus, j.e_corpus)}) vs "
                f"{j.train_pct:+.2f}% ({CORPUS_NAMES.get(j.train_corpus, j.train_corpus)})"
                + (f", verdict there: {j.train_verdict}" if j.train_verdict else ", same verdict")
                for j in differ
                if math.isfinite(j.train_pct)
            )
            + "."
        )
    return [line]


def _control_line(c: Judgement, data: StudyData | None) -> str:
    """The gate: the control's estimate and interval against its planted size, detected or not, and a miscalibration
    (the planted size outside the control's 95% interval) flagged."""
    predicted = control_prediction(data, c) if data else ""
    planted = f"planted {c.expected_pct:+.2f}% (predicted before the run)" if math.isfinite(c.expected_pct) else ""
    size = ", ".join(x for x in (planted, predicted) if x)
    e = c.effect
    observed = _ci(e.delta_pct, e.ci_low_pct, e.ci_high_pct) if e else "–"
    line = f"Control `{c.plus[0]}` ({size or 'size not declared'}; observed {observed}%)"
    if c.verdict == DETECTED:
        line += f" detected ({c.why}, outside the family): the study sees an effect of that size."
    else:
        line += (
            f" **not detected** ({c.why}): the study did not show it can see an effect of that size, so the verdicts "
            "that rest on finding no effect (inconclusive, not replicated, equivalent) are marked *sensitivity not "
            "shown*; significant directional verdicts stand. Add seeds."
        )
    if not (e and math.isfinite(c.expected_pct)):
        return line
    se_pred, p, seeds = control_calibration(data, c) if data else (math.nan, math.nan, 0)
    if math.isfinite(p):  # the planted size is a prediction: its own error counts (issue 43)
        verdict = "**Miscalibrated**" if p < 0.05 else "Calibrated"
        line += (
            f" {verdict}: observed against planted, with the planted size's prediction error (±{se_pred:.2f}% "
            f"from its {seeds} grid seeds), two-sided p {p:.2g}."
        )
    elif not e.ci_low_pct <= c.expected_pct <= e.ci_high_pct:
        line += (
            f" The planted {c.expected_pct:+.2f}% lies outside the control's 95% interval; its prediction error is "
            "not known here (one grid seed, or not a rate control), so calibration is not tested."
        )
    return line


def tuning_lines(data: StudyData) -> list[str]:
    """The learning-rate grid per tuned level: the held-out loss of each rate and the choice (or why none)."""
    spec = data.manifest["spec"].get("tuning") or {}
    if "fixed" in spec:
        return ["### Tuning", "", f"One learning rate by design: {spec['fixed']}", ""]
    if not spec:
        return [
            "### Tuning",
            "",
            "No learning-rate grid in this profile: every arm shares one rate, so every verdict comparing mechanisms "
            "is configuration-limited.",
            "",
        ]
    table = data.tuning
    lines = [
        "### Tuning",
        "",
        f"Each level of `{spec['axis']}` got its own learning rate: a grid of {len(spec['lrs'])} rates at "
        f"{_grid_at(spec)}, chosen by the {'mean ' if 'seeds' in spec else ''}loss on validation windows "
        f"{spec['held_out'][0]}-{spec['held_out'][1] - 1}, which no verdict reads "
        "(lightning_cqk/study/design/tuned_rate.py).",
        "",
        "| level | " + " | ".join(f"lr {lr:g}" for lr in spec["lrs"]) + " | chosen |",
        "|---|" + "---|" * (len(spec["lrs"]) + 1),
    ]
    order = [lv for lv in spec.get("levels") or [] if lv in spec["grid"]]  # the spec's order: a list survives the
    for level in order + [lv for lv in spec["grid"] if lv not in order]:  # sorted keys of study.json, a dict does not
        cells = {lr: loss for lv, lr, _, loss in table.rows if lv == level}
        chosen = table.chosen.get(level, math.nan)
        row = [_grid_cell(cells.get(float(lr), math.nan), table, level, float(lr)) for lr in spec["lrs"]]
        lines.append(f"| {level} | " + " | ".join(row) + f" | {_fmt(chosen, 'g')} |")
    sd_note = " (the mean over the grid seeds ± their sd)" if "seeds" in spec else ""
    lines += ["", f"Held-out loss in nats per token{sd_note}; – where the grid run has not finished.", ""]
    return lines


def _grid_at(spec: dict[str, Any]) -> str:
    """'seed 0' (a grid at one seed) or 'each of seeds 0, 1000, 1001'."""
    if "seeds" not in spec:
        return f"seed {spec['seed']}"
    return "each of seeds " + ", ".join(str(x) for x in spec["seeds"])


def _grid_cell(loss: float, table: TuningTable, level: str, lr: float) -> str:
    """A grid point's held-out loss, with ± the sd over its seeds where it has several."""
    sd = table.spread.get((level, lr), math.nan)
    return _fmt(loss, ".4f") + (f" ± {sd:.4f}" if math.isfinite(sd) and math.isfinite(loss) else "")


def made_by(run: dict[str, Any]) -> tuple[str, ...]:
    """The code revisions that computed a finished run's numbers, from its record: its attempts' (`revisions`), or
    for a run adopted from committed results its twin's (`made_by`, issue 43); () for an adopted run recorded before
    adoption kept its twin's provenance (the revision of an attempt it started before adoption is not its numbers')."""
    if run.get("adopted_from") and not run.get("made_by"):
        return ()
    return tuple(run.get("revisions") or ())


SHARES = {"adopted_from": "adopted", "reused_from": "reused", "same_as": "shared"}


def bookkeeping_line(manifest: dict[str, Any]) -> str:
    """How many runs were computed here, adopted from committed results, reused from a sibling sweep and shared
    within the sweep, counted from the runs' records (never typed by hand), and the ones not finished."""
    runs = manifest.get("runs", [])
    done = [r for r in runs if r.get("status") == "done"]
    counts = {how: sum(1 for r in done if r.get(key)) for key, how in SHARES.items()}
    computed = len(done) - sum(counts.values())
    parts = [f"{computed} computed"] + [f"{n} {how}" for how, n in counts.items() if n]
    unfinished = len(runs) - len(done)
    tail = f"; {unfinished} not finished" if unfinished else ""
    return f"Runs: {len(runs)} ({', '.join(parts)}{tail}; from the runs' records)."


def code_line(manifest: dict[str, Any]) -> str:
    """Which code made the runs: one revision, or each revision with its runs when they differ (a sweep resumed
    after the code changed). Runs record their attempts' revisions (`revisions` in the manifest); a sweep written
    before they did gives the revision of its last invocation, said as such."""
    per_run = [made_by(r) for r in manifest.get("runs", []) if r.get("status") == "done"]
    recorded = [revs for revs in per_run if revs]

    def short(rev: str) -> str:
        if rev == "unknown":  # Ledger.code_revision outside a git checkout
            return "unknown (not a git checkout; the package version is in manifest.json)"
        return rev[:12] + (" (dirty)" if rev.endswith("-dirty") else "")

    if not recorded:
        git = manifest.get("git") or {}
        if not git.get("revision"):
            return ""
        dirty = " (dirty)" if git.get("dirty") else ""
        return f"Code: git {git['revision'][:12]}{dirty} (the sweep's last invocation; its runs record no revision)."
    counts: dict[tuple[str, ...], int] = {}
    for revs in per_run:
        counts[revs] = counts.get(revs, 0) + 1
    if len(counts) == 1 and len(recorded[0]) == 1:
        return f"Code: {'' if recorded[0][0] == 'unknown' else 'git '}{short(recorded[0][0])}."
    parts = []
    for revs, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        what = " then ".join(short(r) for r in revs) if revs else "not recorded"
        parts.append(f"{what}: {n} run{'s' if n != 1 else ''}")
    return "Code: **runs from more than one revision** (" + "; ".join(parts) + ")."


def markdown(data: StudyData, rows: list[dict[str, Any]], judgements: list[Judgement]) -> str:
    """The study's Markdown report (header, verdicts, group table, notes)."""
    manifest = data.manifest
    spec = manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    published = spec.get("published") or {}
    lines = [f"## {spec.get('title', manifest['study'])} ({manifest['study']}, {manifest['profile']} profile)", ""]
    if spec.get("paper") or spec.get("claim"):
        lines += [f"{spec.get('paper', '')}: {spec.get('claim', '')}".strip(": "), ""]
    code = code_line(manifest)
    if code:
        lines += [code, ""]
    lines += [bookkeeping_line(manifest), ""]
    lines += ["### Verdicts", ""] + _claim_lines(judgements, spec, data) + tuning_lines(data)
    lines += ["### Groups", ""]
    lines.append(
        f"| group | seeds (diverged) | val ppl | val bpb | Δ {metric} % [95% CI] | p | test | detectable Δ % | "
        "val-set SE of Δ % | seed-var ratio | moved over last 20% | loss spikes (all seeds) | late train-loss sd % | "
        "tokens | train s | paper Δ % (its unit) |"
    )
    lines.append("|" + "---|" * 16)
    for r in rows:
        is_base = r["group"] == r["baseline"]
        cells = [
            f"{r['group']}{' (baseline)' if is_base else ''}",
            f"{r['seeds']}" + (f" ({r['diverged']})" if r["diverged"] else ""),
            _pm(r["val/ppl_mean"], r["val/ppl_std"], 2),
            _pm(r["val/bpb_mean"], r["val/bpb_std"], 4),
            "–" if is_base else _ci(r["delta_pct"], r["ci_low_pct"], r["ci_high_pct"]),
            _fmt(r["p"], ".3g"),
            r["test"] or "–",
            _fmt(r["mde_pct"], ".2f"),
            _fmt(r["val_se_delta_pct"], ".2f"),
            "–" if is_base else _fmt(r["seed_var_ratio"], ".2f"),
            _fmt(r["settle_pct"], "+.2f") + ("%" if not math.isnan(r["settle_pct"]) else ""),
            _fmt(r["spikes"], ".0f"),
            _fmt(r["late_loss_sd_pct"], ".2f"),
            _si(r["tokens"]),
            _fmt(r["wallclock"], ".0f"),
            "–" if is_base else _fmt(r["published_delta_pct"], "+.1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    se, windows, n_runs = val_sampling_error(data)
    notes = [
        f"Mean ± sample std over the finite seeds of the last validation; Δ, p (unadjusted) and the detectable Δ "
        f"compare {metric} with the baseline group ({', '.join(f'{k}={v}' for k, v in spec['baseline'].items())}, "
        "same other levels). 'moved over last 20%': the change of the metric from the validation at 80% of the "
        "steps to the last, on the same windows (where the final validation scores a larger set than the curve, "
        "its value on the curve's windows, from the per-window losses; near 0: settled).",
        f"Validation-set sampling error: ±{se:.2f}% of {metric} (bootstrap SE over {windows} windows, median of "
        f"{n_runs} runs); of a difference between two groups on the same windows: 'val-set SE of Δ' (bootstrap of "
        "the per-window differences, same seed: the windows' difficulty cancels)."
        if n_runs
        else "Validation-set sampling error: not recorded (no run wrote val_windows.json; "
        "add lightning_cqk.callbacks.ValWindowLosses, as callbacks/sweep.yaml does).",
    ]
    if published:
        notes.append(
            f"Paper Δ % (group table): {published.get('source', 'the paper')}, in the paper's own unit "
            f"({published.get('metric', metric)}; at another scale, corpus and tokenizer): the verdicts compare E, "
            "the same change converted to ours."
        )
    notes.append(
        "Stability: loss spikes are the runs' cumulative train/spikes (LossSpikeMonitor), summed over seeds; the late "
        "train-loss sd is the standard deviation of train/loss over the last 20% of the logged steps, in % of its mean "
        "(mean over seeds); diverged seeds are counted in the seeds column."
    )
    shared = data.shared
    if shared:
        notes.append(
            "Runs shared with other studies (identical configs, overrides and seed: the same run, counted in both): "
            + "; ".join(f"{study}: {', '.join(names)}" for study, names in shared.items())
            + "."
        )
    differs = [f"{r['name']} (vs {r['twin']})" for r in data.manifest.get("runs", []) if r.get("reproduces") is False]
    if differs:
        notes.append(
            "Committed runs not adopted: these probes did not reproduce their committed twins to the last digit on "
            "this machine (another CPU type, or other code), so their arms were computed here: "
            + "; ".join(differs)
            + "."
        )
    once = computed_once(data.manifest)
    if once:
        notes.append(
            "Runs not computed here (shared within the sweep or reused from a sibling sweep: the same recorded "
            "identity, i.e. settings, seed, code, data, packages, device and threads; adopted: the same settings and "
            "data as a committed twin, vouched for by its arm's probe; lightning_cqk/study/run/identity.py; each "
            "counted "
            "once per contrast): " + "; ".join(once) + "."
        )
    same = data.same_results
    if same:
        notes.append(
            "Runs with the same results as another study's runs under another name (seed, learning rate, tokens, "
            "steps and final validation perplexity and loss equal to the last digit: the same settings, "
            "deterministic training; counted in both): "
            + "; ".join(f"{study}: {', '.join(pairs)}" for study, pairs in same.items())
            + "."
        )
    diverged = [r["name"] for g in data.groups.values() for r in g.runs if not math.isfinite(final(r, metric))]
    if diverged:
        notes.append(f"Diverged (non-finite final {metric}; counted, never averaged): {', '.join(diverged)}.")
    if data.unfinished:
        notes.append(
            "Unfinished runs (left out): " + "; ".join(f"{name}: {why}" for name, why in data.unfinished.items()) + "."
        )
    if data.missing:
        notes.append(f"Runs not started (left out): {', '.join(data.missing)}.")
    lines += notes
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "group",
    "baseline",
    "seeds",
    "diverged",
    "val/ppl_mean",
    "val/ppl_std",
    "val/bpb_mean",
    "val/bpb_std",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "p",
    "test",
    "n_used",
    "mde_pct",
    "val_se_delta_pct",
    "seed_var_ratio",
    "settle_pct",
    "spikes",
    "late_loss_sd_pct",
    "tokens",
    "flops",
    "wallclock",
    "published_delta_pct",
)


CLAIM_FIELDS = (
    "claim",
    "control",
    "expect",
    "plus",
    "minus",
    "published_pct",
    "published_ratio",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "var_ratio",
    "var_ci_low",
    "var_ci_high",
    "test",
    "n",
    "diverged",
    "p",
    "p_signflip",
    "p_holm",
    "mde_pct",
    "verdict",
    "why",
    "published_unit",
    "converted_pct",
    "converted_rule",
    "alt_pct",
    "alt_verdict",
    "p_effect",
    "p_holm_effect",
    "tests",
    "family",
    "level",
    "v_low_pct",
    "v_high_pct",
    "seeds_needed",
    "excluded_pct",
    "expected_pct",
    "limited",
    "e_corpus",
    "train_corpus",
    "train_pct",
    "train_verdict",
)


def _cell(value: Any) -> Any:
    """A CSV cell: floats (numpy's included, whose repr is `np.float64(...)`) at full precision as plain numbers."""
    return repr(float(value)) if isinstance(value, float) else value


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(v) for k, v in r.items() if k in CSV_FIELDS})
    return buf.getvalue()


def claims_csv(judgements: list[Judgement]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CLAIM_FIELDS, lineterminator="\n")
    writer.writeheader()
    for j in judgements:
        e, v = j.effect, j.variance
        row = {
            "claim": j.name,
            "control": j.is_control,
            "expect": j.expect,
            "plus": " ".join(j.plus),
            "minus": " ".join(j.minus),
            "published_pct": j.published_pct,
            "published_ratio": j.published_ratio,
            "delta_pct": e.delta_pct if e else math.nan,
            "ci_low_pct": e.ci_low_pct if e else math.nan,
            "ci_high_pct": e.ci_high_pct if e else math.nan,
            "var_ratio": v.ratio if v else math.nan,
            "var_ci_low": v.ci_low if v else math.nan,
            "var_ci_high": v.ci_high if v else math.nan,
            "test": (e or v).test,
            "n": e.n if e else v.n_a,
            "diverged": e.diverged if e else "",
            "p": (e or v).p,
            "p_signflip": e.p_signflip if e else math.nan,
            "p_holm": j.p_holm,
            "mde_pct": j.mde_pct,
            "verdict": j.verdict,
            "why": j.why,
            **{
                k: getattr(j, k)
                for k in CLAIM_FIELDS[CLAIM_FIELDS.index("published_unit") :]
                if k not in ("mde_pct", "tests")
            },
            "tests": " ".join(f"{kind}:{p!r}" for kind, p in j.raw_tests.items()),  # raw p per test (claims_table)
        }
        writer.writerow({k: _cell(x) for k, x in row.items()})
    return buf.getvalue()
