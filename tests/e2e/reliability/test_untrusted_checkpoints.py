"""Checkpoints from elsewhere (issue 25 class 1, and class 8's truncated checkpoint through `glue`).

A checkpoint is a pickle, and a pickle can run code while it loads. Every command that reads one (`generate`,
`eval`, `glue`, `mc-eval`, `fit`/`validate --ckpt_path`, downstream `fit --model.checkpoint`) reads it with
`torch.load(weights_only=True)` (`lightning_cqk.checkpoint.reading.load_checkpoint`): a real checkpoint of `fit`
loads, a file with one extra pickled object whose `__reduce__` would create a marker file is refused by every
command, in a real subprocess, with a message naming the file and what to do, exit status 1, no traceback, and the
marker never appears. A truncated checkpoint says "truncated or corrupt" (through `glue` too, where it was a 70-line
jsonargparse traceback).
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_run import tiny_fit

from lightning_cqk.checkpoint.reading import (
    TRUSTED_GLOBALS,
    CorruptCheckpointError,
    UntrustedCheckpointError,
    check_checkpoint,
    load_checkpoint,
)
from lightning_cqk.cli import class_paths, main
from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.inference.pretrained import load_pretrained

REPO = Path(__file__).resolve().parents[3]


class Payload:
    """Unpickling this runs `touch <marker>`: what a hostile checkpoint would do (with worse than touch)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


@pytest.fixture(scope="module")
def fit_checkpoint(tiny_shards: Path, tmp_path_factory) -> Path:
    """A real checkpoint of `lightning_cqk fit` with the studies' callback stack (callbacks/sweep.yaml: periodic
    checkpoints with RNG state, NaN guard, instruments) and a best-checkpoint, 2 steps of a 1-layer model."""
    args = tiny_fit(
        tiny_shards,
        tmp_path_factory.mktemp("fit") / "runs",
        "--trainer.callbacks+=lightning_cqk.callbacks.BestCheckpoint",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        configs=[REPO / "callbacks" / "sweep.yaml"],
    )
    argv, sys.argv = sys.argv, ["lightning_cqk"]
    try:
        cli = CQKCLI(args=args)
    finally:
        sys.argv = argv
    return Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def evil(fit_checkpoint: Path, tmp_path_factory) -> tuple[Path, Path]:
    """(a copy of the fit checkpoint with one extra pickled entry that would create a marker file, the marker)."""
    root = tmp_path_factory.mktemp("evil")
    marker = root / "MARKER"
    checkpoint = torch.load(fit_checkpoint, weights_only=True)
    checkpoint["notes"] = Payload(marker)
    path = root / "evil.ckpt"
    torch.save(checkpoint, path)
    return path, marker


def test_a_real_fit_checkpoint_holds_only_plain_data_and_loads(fit_checkpoint: Path):
    """The allow-list is found on real files: a fit checkpoint needs nothing beyond torch's own safe types."""
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(fit_checkpoint)) == []
    checkpoint = load_checkpoint(fit_checkpoint)
    assert {"state_dict", "optimizer_states", "callbacks", "hyper_parameters"} <= set(checkpoint)
    assert isinstance(checkpoint["hyper_parameters"]["config"], dict)
    assert load_pretrained(fit_checkpoint).config.n_layer == 1


def test_trusted_globals_are_needed_and_enough(fit_checkpoint: Path, tmp_path: Path):
    """A run configured from Python may leave a pathlib path in its hyper-parameters: loaded, while torch's own
    weights_only load (without the allow-list) refuses the same file."""
    checkpoint = torch.load(fit_checkpoint, weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["data_dir"] = pathlib.Path("/data/shards")
    path = tmp_path / "paths.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(Exception, match="PosixPath"):
        torch.load(path, weights_only=True)
    assert load_checkpoint(path)["datamodule_hyper_parameters"]["data_dir"] == pathlib.Path("/data/shards")
    assert pathlib.PosixPath in TRUSTED_GLOBALS


def test_the_loader_refuses_the_payload_and_runs_nothing(evil: tuple[Path, Path]):
    path, marker = evil
    for read in (load_checkpoint, check_checkpoint, load_pretrained):
        with pytest.raises(UntrustedCheckpointError, match=rf"Checkpoint {path} holds pickled objects .*posix\.system"):
            read(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the control: the full unpickler runs the payload
    assert marker.exists()
    marker.unlink()


def test_truncated_and_damaged_files_say_so(fit_checkpoint: Path, tmp_path: Path):
    data = fit_checkpoint.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2])
    legacy = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {}}, legacy, _use_new_zipfile_serialization=False)
    legacy.write_bytes(legacy.read_bytes()[:-40])
    for path in (cut, legacy):
        with pytest.raises(
            CorruptCheckpointError, match=rf"Checkpoint {path} cannot be loaded: .*truncated or corrupt"
        ):
            load_checkpoint(path)


def _write_inputs(root: Path) -> dict[str, Path]:
    """A GLUE folder (SST-2 only), a multiple-choice jsonl and a local lm-eval task: what each command needs."""
    (root / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train.tsv", "dev.tsv"):
        (root / "glue" / "SST-2" / split).write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    mc = root / "mc.jsonl"
    mc.write_text(json.dumps({"context": "the cat", "choices": ["sat", "ran"], "label": 0}) + "\n")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "toy.yaml").write_text(
        f"task: toy_mc\ndataset_path: json\ndataset_kwargs:\n  data_files: {{test: {mc}}}\noutput_type: multiple_choice"
        "\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return {"glue": root / "glue", "mc": mc, "tasks": tasks, "runs": root / "runs"}


def _commands(ckpt: Path, inputs: dict[str, Path]) -> dict[str, list[str]]:
    quickstart = str(REPO / "configs" / "quickstart.yaml")
    runs = f"--trainer.logger.init_args.save_dir={inputs['runs']}"
    return {
        "generate": ["generate", f"--checkpoint={ckpt}", "--prompt=hello", "--max_new_tokens=2"],
        "eval": ["eval", f"--checkpoint={ckpt}", "--tasks=toy_mc", f"--include_path={inputs['tasks']}", "--limit=1"],
        "mc-eval": ["mc-eval", f"--checkpoint={ckpt}", f"--tasks=[{inputs['mc']}]"],
        "glue": ["glue", f"--checkpoint={ckpt}", "--tasks=[sst2]", "--seeds=[1]", f"--data_dir={inputs['glue']}"],
        "fit --ckpt_path": ["fit", "--config", quickstart, f"--ckpt_path={ckpt}", runs],
        "validate --ckpt_path": ["validate", "--config", quickstart, f"--ckpt_path={ckpt}", runs],
        "fit --model.checkpoint": [
            "fit",
            "--config",
            str(REPO / "configs" / "glue" / "sst2.yaml"),
            f"--model.checkpoint={ckpt}",
            f"--data.data_dir={inputs['glue']}",
            runs,
        ],
    }


def _run_all(commands: dict[str, list[str]], cwd: Path, parallel: int = 4) -> dict[str, subprocess.CompletedProcess]:
    """The commands as real `lightning_cqk` processes, a few at a time."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1")
    env.pop("LIGHTNING_CQK_DEBUG", None)
    env["LIGHTNING_CQK_LOG_DIR"] = str(cwd / "logs")
    done: dict[str, subprocess.CompletedProcess] = {}
    names = list(commands)
    for start in range(0, len(names), parallel):
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "lightning_cqk", *commands[name]],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names[start : start + parallel]
        }
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return _write_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("command", list(_commands(Path("x"), {k: Path(k) for k in ("glue", "mc", "tasks", "runs")})))
def test_every_command_refuses_the_payload(command: str, evil, inputs, monkeypatch):
    """Through each command's own entry (`lightning_cqk.cli.main`), in this process: refused by name, nothing run,
    nothing written."""
    path, marker = evil
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    argv = _commands(path, inputs)[command]
    expected = rf"Checkpoint {path} holds pickled objects that are not plain data \(posix\.system\)"
    error = SystemExit if command == "generate" else UntrustedCheckpointError  # generate prints its errors itself
    with pytest.raises(error, match=expected):
        main(argv)
    assert not marker.exists(), f"{command}: the checkpoint's payload ran"
    assert not any(inputs["runs"].rglob("run.json")), f"{command}: a refused run left a record"


@pytest.mark.slow
def test_from_the_shell_the_refusal_prints_alone(evil, fit_checkpoint, inputs, tmp_path: Path):
    """Real processes (in parallel, about 10 s): the message alone on stderr, exit status 1, no traceback; `glue` on
    a truncated checkpoint says so (it was a 70-line jsonargparse traceback that never said "truncated")."""
    path, marker = evil
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(fit_checkpoint.read_bytes()[:20000])
    commands = {
        "generate": (_commands(path, inputs)["generate"], path, "holds pickled objects that are not plain data"),
        "fit --model.checkpoint": (
            _commands(path, inputs)["fit --model.checkpoint"],
            path,
            "holds pickled objects that are not plain data",
        ),
        "glue (truncated)": (_commands(cut, inputs)["glue"], cut, "truncated or corrupt"),
    }
    results = _run_all({name: argv for name, (argv, _, _) in commands.items()}, cwd=tmp_path)
    problems = []
    for name, (_, file, expected) in commands.items():
        result = results[name]
        if result.returncode != 1 or expected not in result.stderr or str(file) not in result.stderr:
            problems.append(f"{name}: exit {result.returncode}, stderr: {result.stderr[-1500:]}")
        elif "Traceback" in result.stderr:
            problems.append(f"{name}: a traceback without --debug: {result.stderr[-1500:]}")
    assert not problems, "\n\n".join(problems)
    assert not marker.exists(), "the checkpoint's payload ran"


# ------------------------------------------------------------------ issue 34, defect 1: code from plain data
def _popen_spec(marker: Path) -> dict:
    """Plain data that jsonargparse would build into `subprocess.Popen(["sh", "-c", "touch marker"])`."""
    return {"class_path": "subprocess.Popen", "init_args": {"args": ["sh", "-c", f"touch {shlex.quote(str(marker))}"]}}


@pytest.fixture(scope="module")
def plain_data_payload(fit_checkpoint: Path, tmp_path_factory) -> tuple[Path, Path]:
    """(a real checkpoint whose hyper-parameters name `subprocess.Popen` in the attention options, the marker): no
    pickled object at all, so the weights-only loader takes it."""
    root = tmp_path_factory.mktemp("plain")
    marker = root / "MARKER"
    checkpoint = torch.load(fit_checkpoint, weights_only=True)
    checkpoint["hyper_parameters"]["config"]["attention_options"] = {"qk_norm": _popen_spec(marker)}
    path = root / "plain.ckpt"
    torch.save(checkpoint, path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    return path, marker


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate --ckpt_path", "fit --ckpt_path"])
def test_a_class_named_in_a_checkpoints_plain_settings_is_refused_and_never_run(
    command: str, plain_data_payload, inputs, tmp_path: Path
):
    """The trigger of defect 1, from the shell: before the fix the checkpoint's settings went through the parser,
    which built `subprocess.Popen` from the `Any`-typed attention options and ran the command."""
    path, marker = plain_data_payload
    result = _run_all({command: _commands(path, inputs)[command]}, cwd=tmp_path)[command]
    time.sleep(0.5)  # a Popen would have run by now
    assert not marker.exists(), f"{command}: the checkpoint's settings ran a command"
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"The checkpoint {path} names a class in its saved settings" in result.stderr
    assert "config.attention_options.qk_norm holds a class_path" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_class_path_in_the_attention_options_flag_is_refused_before_anything_is_built(tmp_path: Path, monkeypatch):
    """The same payload from a flag and from a config file: a value typed `Any` is data, never instantiated."""
    marker = tmp_path / "MARKER"
    payload = json.dumps({"x": _popen_spec(marker)})
    config = tmp_path / "options.yaml"
    config.write_text(f"model:\n  config:\n    attention_options: {payload}\n")
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    quickstart = str(REPO / "configs" / "quickstart.yaml")
    runs = f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"
    for extra in (["--model.config.attention_options", payload], ["--config", str(config)]):
        with pytest.raises(SystemExit):  # a real fit: the payload used to run when the model was built
            main(["fit", "--config", quickstart, *extra, "--trainer.max_steps=1", runs])
        time.sleep(0.2)
        assert not marker.exists(), f"{extra}: ran the command"
    from jsonargparse import _typehints

    with pytest.raises(class_paths.PlainDataError, match="a class_path in a value that holds plain data"):
        _typehints.adapt_classes_any({"class_path": "subprocess.Popen"}, False, True, None)


def test_only_allow_listed_modules_are_imported_for_a_class_typed_key(tmp_path: Path, monkeypatch):
    """A callback from a module outside the allow-list is refused before the module is imported (its top-level code
    used to run even under --print_config); naming its package in LIGHTNING_CQK_TRUSTED_MODULES lets it in."""
    marker = tmp_path / "IMPORTED"
    (tmp_path / "mylab_callbacks.py").write_text(
        f"import pathlib, lightning as L\npathlib.Path({str(marker)!r}).touch()\nclass Cb(L.Callback):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    argv = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.callbacks+=mylab_callbacks.Cb"]
    monkeypatch.delenv(class_paths.TRUSTED_ENV, raising=False)
    with pytest.raises(SystemExit):
        main([*argv, "--print_config"])
    assert not marker.exists(), "a module outside the allow-list was imported"
    with pytest.raises(class_paths.UntrustedClassError, match="export LIGHTNING_CQK_TRUSTED_MODULES=subprocess"):
        class_paths.check_class_path("subprocess.Popen")
    monkeypatch.setenv(class_paths.TRUSTED_ENV, "mylab_callbacks")
    with pytest.raises(SystemExit) as printed:  # --print_config exits 0 after printing
        main([*argv, "--print_config"])
    assert printed.value.code in (0, None)
    assert marker.exists(), "the trusted module was not imported"
