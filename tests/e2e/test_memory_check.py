"""A configuration that will not fit in memory is refused before anything is prepared or trained, with the numbers
and the flag to override (issue 26; lightning_cqk/run/memory_check.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import tiny_fit

from lightning_cqk.cli import main
from lightning_cqk.errors import UserError
from lightning_cqk.run import memory_check
from lightning_cqk.run.memory_check import MemoryRefused, estimate, largest_fitting_batch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    monkeypatch.chdir(tmp_path)


def test_the_estimate_adds_weights_gradients_adam_activations_and_logits():
    est = estimate(
        n_params=1000, n_layer=2, n_embd=8, mlp_hidden=32, vocab_rows=50, micro_batch=3, seq_len=4, precision="32-true"
    )
    assert (est.parameters, est.gradients, est.optimizer) == (4000, 4000, 8000)
    assert est.activations == 2 * 12 * (9 * 8 + 2 * 32) * 4  # fp32: every saved tensor at 4 bytes
    assert est.logits == 12 * 50 * (4 + 8)
    half = estimate(1000, 2, 8, 32, 50, 3, 4, precision="bf16-mixed", shards=4)
    assert half.activations == 2 * 12 * (2 * 8 * 4 + (7 * 8 + 2 * 32) * 2)  # fp32 norm inputs, the rest bf16
    assert half.parameters == 1000 and half.logits == 12 * 50 * 10
    assert est.total == sum((est.parameters, est.gradients, est.optimizer, est.activations, est.logits))


def test_the_largest_fitting_micro_batch_divides_the_asked_one():
    assert largest_fitting_batch(lambda b: b <= 5, 32) == 4
    assert largest_fitting_batch(lambda b: b <= 5, 12) == 3
    assert largest_fitting_batch(lambda b: False, 32) is None


def _small_host(monkeypatch, gigabytes: float) -> None:
    monkeypatch.setattr(memory_check, "available_bytes", lambda device: (gigabytes * 1e9, "host memory available"))


def test_the_paper_config_on_a_small_host_is_refused_before_its_data_is_prepared(tmp_path, monkeypatch):
    _small_host(monkeypatch, 8.0)
    data_dir = tmp_path / "shards"
    (tmp_path / "abstracts.jsonl").write_text('{"text": "An abstract."}\n')
    args = [
        "fit",
        "--config",
        str(REPO / "configs" / "pubmed.yaml"),
        "--data.source",
        str(tmp_path / "abstracts.jsonl"),
    ]
    with pytest.raises(MemoryRefused) as refused:
        main([*args, f"--data.data_dir={data_dir}", "--data.tokenizer=bytes", "--trainer.accelerator=cpu"])
    message = str(refused.value)
    assert isinstance(refused.value, UserError)
    assert "needs at least" in message and "host memory available is 8.0 GB" in message
    assert "micro-batch of 32 x 1024 tokens" in message and "--memory_check warn" in message
    assert "--data.batch_size 16" in message  # the largest micro-batch that fits, with the accumulation to scale
    assert not data_dir.exists(), "refused before the shards were prepared"
    assert not list((tmp_path / "runs").rglob("run.json")), "and before a run was recorded"


def test_warn_goes_on_and_off_skips(tmp_path, monkeypatch, capsys):
    _small_host(monkeypatch, 1e-6)
    args = _tiny_cli_run(tmp_path)
    with pytest.raises(MemoryRefused):
        main(args)
    main([*args, "--memory_check=warn"])
    assert "WARNING (--memory_check warn): this configuration needs at least" in capsys.readouterr().err
    assert list((tmp_path / "runs").rglob("run.json"))
    assert memory_check.check_memory(object(), object(), object(), "off") is None
    with pytest.raises(MemoryRefused, match="--memory_check must be one of refuse, warn, off"):
        memory_check.check_memory(object(), object(), object(), "sometimes")


def test_a_warmup_as_long_as_the_run_is_named_with_a_scaled_one():
    from lightning_cqk.optim.config import OptimConfig, check_schedule

    message = check_schedule(OptimConfig(warmup_steps=500), 200)  # the paper's warmup in a 200-step CPU run
    assert message.startswith("THE LEARNING RATE NEVER LEAVES ITS WARMUP") and "at most 0.4 x lr" in message
    assert "--model.optim.warmup_steps 20" in message
    assert check_schedule(OptimConfig(warmup_steps=200), 200) is not None  # peak only at the very last step
    assert check_schedule(OptimConfig(warmup_steps=199), 200) is None


def test_the_cpu_size_recipe_of_the_docs_scales_its_warmup(capsys, monkeypatch):
    """docs/configs-and-data.md's "paper config at CPU size" command, resolved by the real parser: its warmup is a
    tenth of its steps, so check_schedule says nothing."""
    import re
    import shlex

    import yaml

    from lightning_cqk.optim.config import OptimConfig, check_schedule

    text = (REPO / "docs" / "configs-and-data.md").read_text().split("### A paper config at CPU size", 1)[1]
    command = shlex.split(re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " "))
    assert command[:2] == ["lightning_cqk", "fit"]
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as done:
        main([*command[1:], "--print_config"])
    assert done.value.code in (0, None)
    resolved = yaml.safe_load(capsys.readouterr().out)
    steps, optim = resolved["trainer"]["max_steps"], resolved["model"]["optim"]
    assert optim["warmup_steps"] * 10 == steps and check_schedule(OptimConfig(**optim), steps) is None
    assert resolved["model"]["config"]["mlp_hidden"] == 4 * resolved["model"]["config"]["n_embd"]


def test_activation_checkpointing_and_the_chunked_loss_shrink_the_estimate_by_their_rule():
    """Checkpointing keeps one block input per layer plus one block rebuilt; a loss chunk holds N tokens of logits."""
    shape = dict(n_params=1000, n_layer=4, n_embd=8, mlp_hidden=32, vocab_rows=50, micro_batch=2, seq_len=16)
    plain = estimate(**shape)
    checkpointed = estimate(**shape, activation_checkpointing=True, loss_chunk=8)
    tokens, block = 2 * 16, (9 * 8 + 2 * 32) * 4
    assert plain.activations == tokens * 4 * block
    assert checkpointed.activations == tokens * (4 * 8 * 4 + block)
    assert plain.logits == tokens * 50 * 12 and checkpointed.logits == 8 * 50 * 12
    assert estimate(**shape, loss_chunk=10_000).logits == plain.logits  # a chunk longer than the batch is the batch


def _tiny_cli_run(tmp_path: Path, *extra: str) -> list[str]:
    """The tiny run (tests/tiny_run.py) of one step with a validation after it, on the quickstart's own corpus,
    prepared into tmp_path/shards when the run starts (a refusal comes before that)."""
    schedule = ["--trainer.max_steps=1", "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1"]
    return tiny_fit(tmp_path / "shards", tmp_path / "runs", "--data.source=builtin:python_docs", *schedule, *extra)


def test_a_validation_that_will_not_fit_is_refused_before_anything_is_trained(tmp_path, monkeypatch):
    """Issue 34 defect 6: a training step that fits and a data.val_batch_size that does not: refused up front, with
    the validation's numbers and a val_batch_size that fits, which works when pasted."""
    _small_host(monkeypatch, 1.0)
    args = _tiny_cli_run(tmp_path, "--data.val_batch_size=65536")
    with pytest.raises(MemoryRefused) as refused:
        main(args)
    message = str(refused.value)
    assert "validation needs at least" in message and "the validation windows at 65536 x 16 tokens" in message
    assert "one training step" not in message, "the training step fits"
    assert "--trainer.limit_val_batches 0" in message
    assert not (tmp_path / "shards").exists() and not list((tmp_path / "runs").rglob("run.json"))
    fits = re.search(r"--data\.val_batch_size (\d+)", message).group(1)
    main([*args, "--data.val_batch_size", fits])  # the advice, pasted: trains and validates
    assert list((tmp_path / "runs").rglob("run.json"))


def test_the_validation_estimate_takes_its_largest_forward():
    """Plain windows (the loss chunk applies), windows longer than block_size (block_size chunks) and each eval
    context (full logits): the peak is the resident state plus the largest of them."""
    from lightning_cqk.run.memory_check import estimate_validation

    shape = dict(n_params=1000, n_embd=8, mlp_hidden=32, vocab_rows=50, val_batch=2, block_size=64)
    resident, block = 4 * 4 * 1000, 9 * 8 + 2 * 32
    plain = estimate_validation(**shape, val_seq_len=32)
    assert (plain.resident, plain.activations, plain.logits) == (resident, 64 * block * 4, 64 * 50 * 12)
    assert plain.forward == "the validation windows"
    chunked = estimate_validation(**shape, val_seq_len=32, loss_chunk=8, eval_contexts=[16, 32])
    assert chunked.forward == "the eval context 32" and chunked.logits == 64 * 50 * 12
    long = estimate_validation(**shape, val_seq_len=256, eval_contexts=[16])
    assert long.seq_len == 64 and long.forward.startswith("the 256-token validation windows in 64-token chunks")


def _tiny_run_objects(precision: str = "32-true", eval_contexts: tuple[int, ...] = (), val_batch: int = 2):
    """(model, datamodule, trainer) as check_memory reads them: 10k parameters, a 512-token vocabulary."""
    from types import SimpleNamespace

    import torch

    config = SimpleNamespace(n_layer=1, n_embd=16, mlp_hidden=64, padded_vocab_size=512, block_size=16)
    model = SimpleNamespace(config=config, parameters=lambda: [torch.zeros(10_000)], eval_contexts=list(eval_contexts))
    data = SimpleNamespace(batch_size=2, seq_len=16, val_batch_size=val_batch, val_seq_len=16)
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        world_size=1,
        num_devices=1,
        precision=precision,
        limit_val_batches=1,
    )
    return model, data, trainer


def _changes_a_resume_accepts(flags: list[str]) -> None:
    from lightning_cqk.run.directory import classify_changes

    allowed, refused = classify_changes({flag: ("before", "after") for flag in flags})
    assert set(allowed) == set(flags) and not refused


def test_on_a_resume_the_memory_advice_names_only_what_a_resume_may_change(monkeypatch):
    """Issue 34 defect 12 (the memory part): a resume refuses a changed data.batch_size or data.val_batch_size, so
    the advice on a resume is what RESUME_POLICY accepts: precision, eval contexts, validation off."""
    shape = dict(n_params=10_000, n_layer=1, n_embd=16, mlp_hidden=64, vocab_rows=512, micro_batch=2, seq_len=16)
    full, half = estimate(**shape).total, estimate(**shape, precision="bf16-mixed").total
    monkeypatch.setattr(memory_check, "available_bytes", lambda device: ((full + half) / 2, "host memory available"))
    with pytest.raises(MemoryRefused) as fresh:
        memory_check.check_memory(*_tiny_run_objects(), resuming=False)
    assert "--data.batch_size 1" in str(fresh.value)
    with pytest.raises(MemoryRefused) as resumed:
        memory_check.check_memory(*_tiny_run_objects(), resuming=True)
    advice, new_run = str(resumed.value).split("start a new run:")
    assert "--trainer.precision bf16-mixed" in advice and "--data." not in advice
    assert "leave out --ckpt_path and add --on_unfinished new --data.batch_size 1" in new_run
    _changes_a_resume_accepts(["trainer.precision"])
    assert memory_check.check_memory(*_tiny_run_objects("bf16-mixed"), resuming=True) is not None  # the advice fits

    # Validation: eval context 16 alone does not fit (its full logits), the plain windows with the loss chunk do.
    monkeypatch.setattr(memory_check, "available_bytes", lambda device: (0.5e6, "host memory available"))
    objects = _tiny_run_objects(eval_contexts=(4, 16), val_batch=8)
    objects[0].loss_chunk = 16
    with pytest.raises(MemoryRefused) as val:
        memory_check.check_memory(*objects, resuming=True)
    message = str(val.value)
    assert "the eval context 16" in message and "--data.val_batch_size" not in message
    assert "--model.eval_contexts '[4]'" in message and "--trainer.limit_val_batches 0" in message
    _changes_a_resume_accepts(["model.eval_contexts", "trainer.limit_val_batches"])
    objects[0].eval_contexts = [4]
    memory_check.check_memory(*objects, resuming=True)  # the advice fits


def _saved_bytes_per_token_and_layer(ffn: str, checkpointing: bool) -> float:
    """What autograd keeps for backward under CPU bf16 autocast, per token and layer: the slope in both the depth
    and the batch (which cancels the per-layer casts of the weights), storages counted once."""
    from lightning_cqk.model.gpt import GPT
    from lightning_cqk.model_config import ModelConfig

    def saved(n_layer: int, batch: int) -> int:
        torch.manual_seed(0)
        config = ModelConfig(n_layer=n_layer, n_head=4, n_embd=64, mlp_hidden=256, block_size=32, vocab_size=100,
                             ffn=ffn)  # fmt: skip
        model = GPT(config)
        model.activation_checkpointing = checkpointing
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        idx = torch.randint(0, 100, (batch, 32))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            model(idx, head=False)
        return sum(n for ptr, n in storages.items() if ptr not in params)

    per_layer = (saved(3, 4) - saved(2, 4)) - (saved(3, 2) - saved(2, 2))  # one layer, 2 x 32 tokens
    return per_layer / (2 * 32)


@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_the_activation_rule_is_what_autograd_keeps_under_autocast(ffn, checkpointing):
    """Issue 32 item 6: the rule said 34 C per token and layer (9 C + 2 F elements at 2 bytes) and 2 C with
    checkpointing; autograd keeps 42 C (norm inputs are the fp32 residual stream, and the norm output was cast three
    times) and 4 C (the fp32 block input). With one cast of each norm output the measurement is 38 C + small per-token
    statistics (norm and softmax), and the rule follows it."""
    from lightning_cqk.run.memory_check import block_activation_bytes, residual_bytes_per_element

    measured = _saved_bytes_per_token_and_layer(ffn, checkpointing)
    if checkpointing:
        rule = 64 * residual_bytes_per_element("bf16-mixed")
    else:
        rule = block_activation_bytes(64, 256, "bf16-mixed", gated=ffn == "swiglu")
    assert rule <= measured <= rule * 1.02, (measured / 64, rule / 64)
