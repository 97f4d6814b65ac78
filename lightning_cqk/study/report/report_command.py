"""Report of a sweep: verdicts, tables (Markdown and CSV) and figures (PNG) from the runs' TensorBoard scalars.

    lightning_cqk report runs/coupling-cpu [--output DIR]

Reads `<sweep>/manifest.json` (written by `lightning_cqk sweep`: the spec, the groups and seeds of the runs) and,
for every run, its TensorBoard event files, `budget.json` and `val_windows.json`, and writes into `<sweep>/report/`
(or `--output`):

    <study>.md   verdicts first: per claim of the spec (`claims:`) the paper's change beside ours with its 95%
                 interval, the test (paired t over seeds, Welch where runs do not pair; Holm-adjusted over the study),
                 the minimum detectable effect at 80% power and the computed verdict
                 (lightning_cqk/study/judge/verdict.py);
                 the positive control (`control:`), which gates the null-type verdicts; then one row per group.
    <study>.csv  the group table (every number of the rows, floats in full).
    claims.csv   the verdict table.
    figures      val_curves.png (absolute curves, and the change vs the baseline per seed pair, small multiples),
                 stability.png (gradient norm, loss spikes), ppl_vs_tokens.png (lightning_cqk/study/report/figures.py).

The report is written whole into a hidden folder beside its destination and swapped in (`report_folder.py`): a
report killed or out of disk space leaves the previous complete report (or none), never a mix; files in the folder
that no report wrote (a README.md) are kept.

Finished runs only: a run counts when it wrote `budget.json` and its last validation is at its last training step
(a run killed during its final validation, or resumed without redoing it, is listed as unfinished, never scored with
an older validation). A run whose final metric is NaN or inf is counted as diverged: it is named, it never enters a
mean or a test, and a comparison uses the seeds finite in all of its groups.

Per group the table also says how much the metric still moved over the last 20% of training (from the last
validation at or before 80% of the steps to the final one, mean over seeds): a reader sees whether runs had settled.
The validation set's own sampling error is the bootstrap standard error over its windows (`val_windows.json`,
written at the final validation by `lightning_cqk.callbacks.ValWindowLosses`), as a % of the metric; per compared
group also that of its difference from the baseline on the same windows (what the set alone makes of a change).

A run's scalar value at a step is the last one written for that step (a resumed run re-logs the steps between its
checkpoint and where it was killed); its final value is the value at its largest step.
"""

from __future__ import annotations

import argparse
import errno
import shlex
import shutil
import sys
from pathlib import Path

from lightning_cqk.study.judge.group_estimates import table_rows, verdicts
from lightning_cqk.study.report import report_folder
from lightning_cqk.study.report.render import claims_csv, markdown, to_csv
from lightning_cqk.study.report.report_read import ReportError, collect
from lightning_cqk.study.results_model import StudyData

# the report's stages live in their own modules: reading (report_read.py), estimators (group_estimates.py), rendering
# (render.py); this module is the command that runs them in that order and writes the folder


def write_report(
    sweep_dir: str | Path, output: str | Path | None = None, quiet: bool = False, glue: list[str] | None = None
) -> dict[str, Path]:
    """Write `<study>.md`, `<study>.csv`, `claims.csv` and the figures; print the Markdown. Returns the paths.

    GLUE: the `glue.json` tables (`lightning_cqk glue`) of the sweep's checkpoints, and of the extra checkpoints or
    directories in `glue`, are put side by side in a "GLUE" section of the Markdown and in `glue.md`.
    """
    from lightning_cqk.study.report.figures import figures

    sweep_dir = Path(sweep_dir)
    data = collect(sweep_dir)
    if not any(g.runs for g in data.groups.values()):
        raise ReportError(
            f"{sweep_dir}: none of the {len(data.manifest['runs'])} runs has finished (budget.json and a last "
            "validation at its last step); run the sweep first."
            + (f" Unfinished: {'; '.join(f'{k}: {v}' for k, v in data.unfinished.items())}." if data.unfinished else "")
        )
    from lightning_cqk.study.report.results import COMMITTED, same_results, shared_runs, write_committed

    out = Path(output) if output is not None else (sweep_dir if data.committed else sweep_dir / "report")
    data.shared = shared_runs(out, data.manifest)
    data.same_results = same_results(out, data)
    study = data.manifest["study"]
    rows = table_rows(data)
    judgements = verdicts(data)
    md = with_live_sweep_note(markdown(data, rows, judgements), data, output)
    glue_md = _glue_section(sweep_dir, glue or [])
    if glue_md:
        md = f"{md.rstrip()}\n\n## GLUE (fine-tuned checkpoints, `lightning_cqk glue`)\n\n{glue_md}"
    names = {"markdown": f"{study}.md", "csv": f"{study}.csv", "claims": "claims.csv"}
    in_place = data.committed and out.resolve() == sweep_dir.resolve()  # `report <results folder>`: its inputs
    try:  # the whole report is written beside `out` and swapped in: never half old, half new (report_folder.py)
        with report_folder.staged(out, owned=report_folder_owns(study)) as stage:
            if glue_md:
                (stage / "glue.md").write_text(glue_md)
            (stage / names["markdown"]).write_text(md)
            (stage / names["csv"]).write_text(to_csv(rows))
            (stage / names["claims"]).write_text(claims_csv(judgements))
            if in_place:  # the committed inputs go into the new folder unchanged (the swap replaces the folder)
                for name in COMMITTED:
                    if (out / name).is_file():
                        shutil.copy2(out / name, stage / name)
                        names[name] = name
            else:
                names.update({path.name: path.name for path in write_committed(data, stage)})
            drawn = figures(data, stage, judgements)
            if in_place:  # drawn from the runs' event files, which a results folder does not hold: kept as committed
                for fig in drawn:
                    if (out / fig.name).is_file():
                        shutil.copy2(out / fig.name, fig)
            names.update({fig.stem: fig.name for fig in drawn})
    except report_folder.NotAReportFolder as err:
        raise ReportError(
            f"{err}: the report replaces its folder as a whole, which would delete them. Write it into a new folder "
            f"or one that holds only an earlier report: lightning_cqk report {sweep_dir} --output <new folder>."
        ) from None
    except OSError as err:
        raise ReportError(write_failure(out, sweep_dir, err)) from None
    paths = {key: out / name for key, name in names.items()}
    if not quiet:
        print(md)
        pngs = ", ".join(p.name for p in paths.values() if p.suffix == ".png")
        print(f"Report: {paths['markdown']}, {paths['csv']}, {paths['claims']}; figures ({out}): {pngs}")
        from lightning_cqk.study.report.second_sources import unchecked_note

        note = unchecked_note(data)
        if note:
            print(note)
    return paths


def with_live_sweep_note(md: str, data: StudyData, output: str | Path | None) -> str:
    """`md` with a line under its title when a sweep still runs in the sweep directory: the report is an interim one
    of an unfinished, live sweep (its unfinished runs are left out of every number), to be written again at the end."""
    from lightning_cqk.study.run.ledger import live_owner

    source = Path(data.source)
    owner = None if data.committed else live_owner(source)
    if owner is None:
        return md
    done = sum(len(g.runs) for g in data.groups.values()) + len(data.tuning_runs)
    again = shlex.join(["lightning_cqk", "report", str(source), *(["--output", str(output)] if output else [])])
    note = (
        f"**Interim report of a live sweep:** a sweep is still running in {source} ({owner.describe()}); "
        f"{done} of its {len(data.manifest['runs'])} runs have finished, and only they are in these numbers. "
        f"Write the report again when the sweep has ended: `{again}`."
    )
    title, _, rest = md.partition("\n")
    return f"{title}\n\n{note}\n{rest}"


def report_folder_owns(study: str):
    """Whether a file name is one a report of `study` writes (recognises reports made before `.report.json`)."""
    tables = {f"{study}.md", f"{study}.csv", "claims.csv", "runs.csv", "glue.md", "study.json", "curves.csv"}
    tables |= {"val_windows.json"}
    return lambda name: name in tables or name.endswith(".png")


def write_failure(out: Path, sweep_dir: Path, err: OSError) -> str:
    """One paragraph for a report that could not be written (a full disk, a quota, a file-size limit)."""
    code = f", {errno.errorcode.get(err.errno, err.errno)}" if err.errno else ""
    what = f"{err.strerror or err}{code}" + (f", writing {Path(err.filename).name}" if err.filename else "")
    before = "The previous report there is unchanged" if out.exists() else "No report was left there"
    full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    fix = (
        f"Free space on that disk (`df -h {out.parent}`; the report needs a few MB) and run the same command again, "
        f"or write it elsewhere: lightning_cqk report {sweep_dir} --output <folder on another disk>."
        if full
        else f"Check that {out.parent} is writable (permissions, a mounted disk), or write it elsewhere: "
        f"lightning_cqk report {sweep_dir} --output <folder>."
    )
    return f"could not write the report into {out} ({what}). {before} (the partial new one was removed). {fix}"


def _glue_section(sweep_dir: Path, extra: list[str]) -> str:
    """The GLUE tables under the sweep directory and at `extra`, side by side ('' when there are none)."""
    from lightning_cqk.downstream.glue_table import JSON_NAME, side_by_side

    paths = sorted(p for p in sweep_dir.rglob(JSON_NAME) if "report" not in p.relative_to(sweep_dir).parts)
    paths += [Path(p) for p in extra]
    return side_by_side(paths) if paths else ""


def report_command(argv: list[str]) -> None:
    """`lightning_cqk report runs/<sweep> [--output DIR]`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk report", description="Verdicts, tables and figures of a sweep from its runs' scalars."
    )
    parser.add_argument("sweep_dir", help="a sweep directory, e.g. runs/coupling-cpu")
    parser.add_argument("--output", default=None, help="where to write (default <sweep_dir>/report)")
    parser.add_argument(
        "--glue",
        nargs="*",
        default=[],
        help="more checkpoints / run directories / glue.json files whose GLUE tables join the sweep's own",
    )
    args = parser.parse_args(argv)
    try:
        write_report(args.sweep_dir, args.output, glue=args.glue)
    except ReportError as err:
        sys.exit(f"lightning_cqk report: {err}")
