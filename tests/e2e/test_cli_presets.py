"""Size presets through the real CLI (issue 13 class 0): a preset gives its documented shape in the resolved config,
the built model and the run name; a shape field set in a config file or on the command line still wins; and every
paper config and every study's `paper` profile resolves to the shape of the preset it names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.cli import main
from lightning_cqk.cli.presets import resolve_shape_in
from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.model_config import PRESETS, preset_shape
from lightning_cqk.study.design.spec import expand

REPO = Path(__file__).resolve().parents[2]
PUBMED = REPO / "configs" / "pubmed.yaml"
SHAPE = ("n_layer", "n_head", "n_embd", "mlp_hidden")
SHAPE_FLAGS = tuple(f"model.config.{k}" for k in ("preset", *SHAPE))
PARAMS_60M = 57_199_616  # model_config.py's table: 60m with the GPT-2 vocabulary


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def printed_model(capsys, *args: str) -> dict:
    """`lightning_cqk fit ... --print_config`, in process: the resolved model config it prints."""
    with pytest.raises(SystemExit) as done:
        main(["fit", *args, "--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)["model"]["config"]


def test_print_config_shows_the_preset_shape_and_an_explicit_field_wins(capsys):
    shown = printed_model(capsys, "--config", str(PUBMED))
    assert shown["preset"] == "60m"
    assert {k: shown[k] for k in SHAPE} == {k: PRESETS["60m"][k] for k in SHAPE}  # was 4/4/128/512 (tiny)
    shown = printed_model(capsys, "--config", str(PUBMED), "--model.config.n_layer", "6")
    assert {k: shown[k] for k in SHAPE} == {**{k: PRESETS["60m"][k] for k in SHAPE}, "n_layer": 6}
    # The preset named last wins over the one in the file, and fields nobody set follow it.
    shown = printed_model(capsys, "--config", str(PUBMED), "--model.config.preset", "150m")
    assert {k: shown[k] for k in SHAPE} == {k: PRESETS["150m"][k] for k in SHAPE}


def test_the_built_model_and_the_run_name_are_the_preset_s(tmp_path: Path):
    common = ["--config", str(PUBMED), f"--trainer.logger.init_args.save_dir={tmp_path}"]
    with torch.device("meta"):  # the real 60m model, without allocating or initialising its weights
        cli = CQKCLI(args=common, run=False)
        explicit = CQKCLI(args=[*common, "--model.config.n_layer=6"], run=False)
    padding = cli.model.model.num_parameters()["vocab_padding"]  # 47 rows of 512: the vocabulary padded to 50,304
    assert padding == 47 * 512 and sum(p.numel() for p in cli.model.parameters()) == PARAMS_60M + padding
    assert (cli.model.config.n_layer, cli.model.config.n_embd) == (10, 512)
    assert cli.trainer.logger.version == "standard-60m-s1337"
    # An explicit field wins, and the run directory says so.
    assert explicit.model.config.n_layer == 6 and explicit.model.config.n_embd == 512
    per_layer = (PARAMS_60M + padding - sum(p.numel() for p in explicit.model.parameters())) / 4
    assert per_layer == 12 * 512 * 512 + 2 * 512  # 4 blocks fewer: attention 4C^2 + MLP 8C^2 + two LayerNorms
    assert explicit.trainer.logger.version == "standard-60m-L6-s1337"


def test_every_paper_config_and_paper_profile_resolves_to_its_preset(tmp_path: Path):
    """Every configs/*.yaml, and every run of every study's `paper` profile, parsed by the real CLI parser."""
    with torch.device("meta"):
        parser = CQKCLI(args=["--config", str(REPO / "configs" / "quickstart.yaml")], run=False).parser
    cases: dict[str, list[str]] = {p.name: ["--config", str(p)] for p in sorted((REPO / "configs").glob("*.yaml"))}
    for spec in sorted((REPO / "configs" / "ablations").glob("*.yaml")):
        if "paper" not in yaml.safe_load(spec.read_text()).get("profiles", {}):
            continue
        for run in expand(spec, "paper", output=tmp_path / spec.stem).runs:
            # Only the config files and the model.config flags decide the shape: one parse per distinct set.
            shape_args = [f"--{k}={v}" for k, v in run.overrides.items() if k.startswith(SHAPE_FLAGS)]
            args = [a for c in run.configs for a in ("--config", c)] + shape_args
            cases.setdefault(" ".join(args), args)
    assert sum("preset=350m" in name for name in cases) >= 3 and len(cases) > 10, sorted(cases)
    for name, args in cases.items():
        resolved = resolve_shape_in(parser.parse_args(args))
        model = resolved.model.config
        given = {k: v for k, v in _explicit_shape(args).items() if v is not None}
        assert {k: model[k] for k in SHAPE} == {
            k: v for k, v in preset_shape(model.preset, **given).items() if k in SHAPE
        }, name
        if not given:
            assert {k: model[k] for k in SHAPE} == {k: PRESETS[model.preset][k] for k in SHAPE}, name


def _explicit_shape(args: list[str]) -> dict[str, int | None]:
    """Shape fields set by the --config files or flags of a command line (last one wins)."""
    given: dict[str, int | None] = {}
    for i, arg in enumerate(args):
        if arg == "--config":
            section = (yaml.safe_load(Path(args[i + 1]).read_text()) or {}).get("model", {}).get("config", {}) or {}
            given.update({k: section[k] for k in SHAPE if k in section})
        elif arg.startswith("--model.config.") and "=" in arg:
            key, value = arg[len("--model.config.") :].split("=", 1)
            if key in SHAPE:
                given[key] = int(value)
    return given


def test_mlp_hidden_follows_n_embd_unless_set(capsys):
    """Issue 26: `tiny` at n_embd 256 gets a 4x MLP (1024), not the preset's absolute 512; an explicit width wins."""
    from lightning_cqk.model_config import ModelConfig, size_label

    assert ModelConfig(preset="tiny", n_embd=256).mlp_hidden == 1024
    assert ModelConfig(preset="60m", n_embd=256, n_head=4).mlp_hidden == 1024
    assert ModelConfig(preset="tiny", n_embd=256, mlp_hidden=512).mlp_hidden == 512
    assert ModelConfig(preset="tiny").mlp_hidden == PRESETS["tiny"]["mlp_hidden"]
    for preset, shape in PRESETS.items():  # the rule keeps every preset's own width
        assert preset_shape(preset) == shape
    printed = printed_model(
        capsys, "--config", str(PUBMED), "--model.config.n_embd", "256", "--model.config.n_head", "4"
    )
    assert (printed["n_embd"], printed["mlp_hidden"]) == (256, 1024)
    # the run name says a width only when it is not the one that follows n_embd
    assert size_label("tiny", n_embd=256) == "tiny-d256"
    assert size_label("tiny", n_embd=256, mlp_hidden=512) == "tiny-d256-ff512"
    assert size_label("tiny", mlp_hidden=1024) == "tiny-ff1024"
