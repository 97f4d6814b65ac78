"""lm-eval end to end, offline, on tasks defined in conftest.py from local jsonl files: through `simple_evaluate`
(every metric recomputed from direct log-likelihoods), through `lightning_cqk eval` (one real subprocess), and
mc-eval's agreement with the adapter on the same items."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from lmeval_helpers import DOCS, GEN_ITEMS, MC_ITEMS, save_checkpoint

pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra: pip install -e '.[eval]' (make test installs it)")

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from lightning_cqk.downstream.multiple_choice import MCExample, evaluate_mc  # noqa: E402
from lightning_cqk.evaluation.command import default_output, task_manager_for  # noqa: E402
from lightning_cqk.evaluation.lm import CQKLM  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def _evaluate(lm: CQKLM, task_dir: Path, tasks: list[str]) -> dict:
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
    )


def _requests(lm: CQKLM, kind: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return getattr(lm, kind)([Instance(kind, {}, a, 0) for a in args], disable_tqdm=True)


def test_a_local_task_runs_end_to_end_through_simple_evaluate(model, tokenizer, task_dir):
    lm = CQKLM(model=model, tokenizer=tokenizer, dtype="float64", device="cpu", batch_size=4)
    out = _evaluate(lm, task_dir, ["toy_mc", "toy_rolling", "toy_gen"])
    res = out["results"]
    # multiple choice: acc and acc_norm (by characters) from the adapter's loglikelihoods of " " + choice
    correct = correct_norm = 0
    for item in MC_ITEMS:
        lls = [ll for ll, _ in _requests(lm, "loglikelihood", [(item["context"], " " + c) for c in item["choices"]])]
        correct += max(range(len(lls)), key=lls.__getitem__) == item["label"]
        norm = [ll / len(c) for ll, c in zip(lls, item["choices"])]
        correct_norm += max(range(len(norm)), key=norm.__getitem__) == item["label"]
    assert res["toy_mc"]["acc,none"] == pytest.approx(correct / len(MC_ITEMS))
    assert res["toy_mc"]["acc_norm,none"] == pytest.approx(correct_norm / len(MC_ITEMS))
    # rolling: bits per byte of the summed document log-likelihoods
    lls = _requests(lm, "loglikelihood_rolling", [(d,) for d in DOCS])
    n_bytes = sum(len(d.encode()) for d in DOCS)
    assert res["toy_rolling"]["bits_per_byte,none"] == pytest.approx(-sum(lls) / n_bytes / math.log(2), rel=1e-9)
    assert res["toy_rolling"]["byte_perplexity,none"] == pytest.approx(math.exp(-sum(lls) / n_bytes), rel=1e-9)
    # generation: the task's until and max_gen_toks reach generate_until
    gens = [s["resps"][0][0] for s in sorted(out["samples"]["toy_gen"], key=lambda s: s["doc_id"])]
    settings = {"until": ["\n"], "max_gen_toks": 5}
    assert gens == _requests(lm, "generate_until", [(g["prompt"], settings) for g in GEN_ITEMS])
    assert all(len(tokenizer.encode(g)) <= 5 and "\n" not in g for g in gens)
    assert res["toy_gen"]["exact_match,none"] == pytest.approx(
        sum(g == item["answer"] for g, item in zip(gens, GEN_ITEMS)) / len(GEN_ITEMS)
    )
    assert out["config"]["attention"] == "standard" and out["config"]["prefix_eos"] is False


def test_mc_eval_agrees_with_the_adapter_under_its_conventions(model, tokenizer, task_dir):
    """mc-eval = the adapter with prefix_eos=True, and mc-eval's acc_norm (per UTF-8 byte) = lm-eval's acc_bytes;
    for these ASCII choices also lm-eval's acc_norm (per character). 0-shot (the few-shot samplers differ)."""
    examples = [MCExample(i["context"], tuple(i["choices"]), i["label"]) for i in MC_ITEMS]
    mine = evaluate_mc(model, tokenizer, examples, block_size=model.config.block_size)
    lm = CQKLM(model=model, tokenizer=tokenizer, dtype="float64", device="cpu", prefix_eos=True)
    out = _evaluate(lm, task_dir, ["toy_mc"])
    samples = sorted(out["samples"]["toy_mc"], key=lambda s: s["doc_id"])
    for record, sample in zip(mine["records"], samples):
        assert [float(r[0][0]) for r in sample["resps"]] == pytest.approx(record["logprobs"], rel=1e-10, abs=1e-10)
    res = out["results"]["toy_mc"]
    assert res["acc,none"] == mine["acc"]
    assert res["acc_bytes,none"] == mine["acc_norm"] == res["acc_norm,none"]
    # lm-eval's own convention (no EOS before a non-empty context) scores differently
    plain = _evaluate(CQKLM(model=model, tokenizer=tokenizer, dtype="float64", device="cpu"), task_dir, ["toy_mc"])
    resps = [float(r[0][0]) for s in sorted(plain["samples"]["toy_mc"], key=lambda s: s["doc_id"]) for r in s["resps"]]
    assert resps != pytest.approx([lp for r in mine["records"] for lp in r["logprobs"]], rel=1e-6)


def test_eval_command_end_to_end(model, task_dir, tmp_path):
    """The real CLI in a subprocess: lm-eval's table on stdout, the results JSON where --output says."""
    ckpt = save_checkpoint(model, tmp_path / "last.ckpt")
    out = tmp_path / "results" / "toy.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1"}
    args = [f"--checkpoint={ckpt}", "--tasks=toy_mc,toy_rolling", f"--include_path={task_dir}", f"--output={out}"]
    run = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "eval", *args, "--limit=3", "--bootstrap_iters=0", "--batch_size=2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "|toy_mc" in run.stdout and "|toy_rolling" in run.stdout and "acc_norm" in run.stdout
    results = json.loads(out.read_text())
    assert set(results["results"]) == {"toy_mc", "toy_rolling"}
    assert results["config"]["model"] == "lightning_cqk" and results["config"]["limit"] == 3
    assert results["config"]["checkpoint"] == str(ckpt.resolve())
    assert "samples" not in results


@pytest.mark.slow
def test_eval_with_the_hub_out_of_reach_reads_the_cache_only_and_fails_at_once(model, tmp_path):
    """Issue 35: offline, `eval` spent 32 s on five Hub retries (with growing waits) before its clean message."""
    ckpt = save_checkpoint(model, tmp_path / "last.ckpt")
    with socket.socket() as s:  # a port nothing listens on: the Hub's address refuses at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"),
               HF_ENDPOINT=f"http://127.0.0.1:{port}")  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "eval", f"--checkpoint={ckpt}", "--tasks=hellaswag", "--limit=1"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "the Hugging Face Hub is out of reach" in run.stderr and "local datasets cache only" in run.stderr
    assert "Retrying" not in run.stderr, "no download was tried"
    assert "a task's data could not be downloaded" in run.stderr


def test_default_output_is_beside_the_checkpoint_and_never_overwrites(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    first = default_output(str(ckpt), ["hellaswag", "arc_easy"], 0, None)
    assert first == ckpt.parent / "last.lm_eval-hellaswag+arc_easy-0shot.json"
    first.write_text("{}")
    assert default_output(str(ckpt), ["hellaswag", "arc_easy"], 0, None).name.endswith("0shot-2.json")
    assert default_output(str(ckpt), ["x"], None, 100).name == "last.lm_eval-x-defaultshot-limit100.json"


def test_unknown_tasks_and_a_missing_lm_eval_are_explained(task_dir, monkeypatch, tmp_path):
    assert task_manager_for(["toy_mc"], str(task_dir)).match_tasks(["toy_mc"]) == ["toy_mc"]
    with pytest.raises(ValueError, match="is not a directory"):
        task_manager_for(["toy_mc"], str(tmp_path / "nowhere"))
    import lm_eval.tasks

    # (lm-eval's own 200+ task folders take ~10 s to index: left out here)
    local_only = lambda include_path=None, **kw: TaskManager(include_path=include_path, include_defaults=False)  # noqa: E731
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", local_only)
    with pytest.raises(ValueError, match=r"Unknown lm-eval task\(s\) 'toy_mx' \(did you mean toy_mc.*--include_path"):
        task_manager_for(["toy_mc", "toy_mx"], str(task_dir))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    from lightning_cqk.cli import main

    with pytest.raises(SystemExit, match=r"pip install -e '\.\[eval\]'"):
        main(["eval", "--checkpoint", "x.ckpt", "--tasks", "toy_mc"])
