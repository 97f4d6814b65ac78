"""`lightning_cqk new-study NAME --attention X`: a study spec of your backend against standard, ready to dry-run.

The spec it writes is the coupling study's cpu profile (configs/ablations/coupling.yaml, the tiny model on the built-in
corpus) with two arms, `standard` and yours (a registered name, an installed plugin's, or `package.module:Class`):
each arm at its own learning rate from a 3-rate grid on held-out windows, the planted control (the baseline at the
rate its grid predicts +3% for, which must be detected before any verdict counts), the power plan's paired sd, and
one claim you state: the effect you expect (`--effect`, in % of validation byte perplexity, the study's unit; negative
is better) and where it comes from. `lightning_cqk sweep NAME.yaml --dry-run` then shows the runs, the seeds the
claim needs at that effect, and the time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lightning_cqk.study.design.spec_checks import NAME

TEMPLATE = """\
# {study}: {arm} vs standard attention (written by `lightning_cqk new-study`; edit freely).
#   lightning_cqk sweep {path} --dry-run     # the runs, the seeds the claim needs, the time
#   lightning_cqk sweep {path}               # tiny runs on the built-in corpus, CPU
#   lightning_cqk report runs/{study}-cpu
study: {study}
title: {arm} vs standard attention
paper: {source_q}
claim: {arm} changes validation perplexity by {effect:+.1f}% against standard attention at the tiny scale
metric: val/ppl
baseline: {{arm: standard}}
axes:
  arm:
    standard: {{model.config.attention: standard}}
    {arm}: {{model.config.attention: {attention}, model.config.attention_options: {options}}}
profiles:
  cpu:      # tiny (0.8M params), bytes, the built-in corpus (no download), 500 steps x 1,024 tokens
    configs: [configs/quickstart.yaml, callbacks/sweep.yaml]
    jobs: 2
    seeds: [{seeds}]
    # the planted control: the baseline at the rate its own grid predicts +3% for; no verdict counts unless it is seen
    control:
      name: lower_lr
      overrides: {{}}
      lr_scale: auto
      expect: higher
      expected_pct: 3.0
      seeds: [1, 2, 3, 4, 5, 6, 7, 8]
      text: the baseline at the rate its grid predicts +3% for
    tuning:                                 # each arm's own rate, chosen on windows the verdicts never read
      axis: arm
      lrs: [2.0e-3, 4.0e-3, 8.0e-3]
      seeds: [0, 1000, 1001]
      held_out: [1024, 1152]
      overrides: {{data.final_val_windows: 1152, trainer.val_check_interval: 500}}
    planning:                               # paired sd (%) of one seed's effect, as the coupling study measured it
      sd_pct: {{default: 1.6, control-lower_lr: 1.69}}
    overrides:
      data.seq_len: 256
      data.batch_size: 4
      data.val_batch_size: 16
      data.val_fraction: 0.2
      data.data_dir: data/ablations/python_docs-bytes-val20
      trainer.limit_val_batches: 4
      data.final_val_windows: 1024
      trainer.val_check_interval: 50        # validates at the last step (500 = 10 x 50)
      trainer.log_every_n_steps: 10
      trainer.enable_progress_bar: false
      trainer.enable_model_summary: false
      model.optim.warmup_steps: 50
      budget.tokens: 512000                 # 500 steps of 4 x 256 tokens
claims:   # your expectation, stated before the runs: the effect in % of validation byte PPL (negative: better)
  - name: {arm}-vs-standard
    text: {arm} {direction} val PPL vs standard
    group: {arm}
    vs: standard
    expect: {expect}
    published: {{value: {effect}, unit: byte_ppl, note: {source_q}}}
"""


def write_spec(
    study: str,
    attention: str,
    options: dict,
    effect: float,
    source: str,
    seeds: int,
    path: Path,
) -> Path:
    """Write the spec (module docstring) to `path`; refuses to overwrite a file."""
    if not NAME.match(study):
        raise ValueError(f"study name {study!r} must be a plain name (letters, digits, _ . + = -).")
    if path.exists():
        raise FileExistsError(f"{path} exists; give another --output or remove it first.")
    if effect == 0:
        raise ValueError("--effect 0 states no change: give the effect you expect (e.g. -2.0 for 2% lower val PPL).")
    arm = "mine" if ":" in attention else attention
    if arm == "standard":
        raise ValueError("--attention standard is the baseline itself: name your backend.")
    text = TEMPLATE.format(
        study=study,
        arm=arm,
        attention=attention,
        options=json.dumps(options),
        effect=effect,
        expect="lower" if effect < 0 else "higher",
        direction="lowers" if effect < 0 else "raises",
        source_q=json.dumps(source),  # a JSON string is a YAML string: quotes and colons kept
        seeds=", ".join(str(s) for s in range(1, seeds + 1)),
        path=path,
    )
    path.write_text(text)
    return path


def new_study_command(argv: list[str]) -> None:
    """`lightning_cqk new-study NAME --attention X [--options JSON] [--effect PCT] [--source TEXT] [--seeds N]`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk new-study",
        description="Write a study spec of your attention backend against standard (tuned rates, planted control, "
        "power plan, your claim); dry-run it with lightning_cqk sweep NAME.yaml --dry-run.",
    )
    parser.add_argument("name", help="the study's name (also the file NAME.yaml unless --output)")
    parser.add_argument("--attention", required=True, help="your backend: a name, a plugin's name or module:Class")
    parser.add_argument("--options", default="{}", help="its options as a JSON object")
    parser.add_argument("--effect", type=float, default=-2.0, help="the effect you expect, %% of val byte PPL")
    parser.add_argument("--source", default="my expectation", help="where the expected effect comes from")
    parser.add_argument("--seeds", type=int, default=26, help="paired seeds (26: about 1%% detectable)")
    parser.add_argument("--output", default=None, help="the spec file (default NAME.yaml here)")
    args = parser.parse_args(argv)
    from lightning_cqk import attention
    from lightning_cqk.errors import ConfigError

    try:
        options = json.loads(args.options)
        if not isinstance(options, dict):
            raise ValueError(f"--options must be a JSON object, got {args.options!r}")
        attention.get_attention(args.attention)  # an unknown name or a path that does not import: said now
        path = write_spec(
            args.name,
            args.attention,
            options,
            args.effect,
            args.source,
            args.seeds,
            Path(args.output or f"{args.name}.yaml"),
        )
    except (ConfigError, ValueError, FileExistsError) as err:
        sys.exit(f"lightning_cqk new-study: {err}")
    print(f"wrote {path}; next: lightning_cqk sweep {path} --dry-run")
