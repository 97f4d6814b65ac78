"""The GPU suite (`pytest -m gpu`; skipped without CUDA, so CI on CPU only imports it; `make gpu-check` runs it).

    every backend at 60m, T 1024, bf16, eager and compiled: 200 steps, finite losses, the flash or cuDNN SDPA kernel
        forced (`sdpa_kernel`: a backend that could not use one raises) where the backend can use one
    5 optimizer steps of the shipped quickstart callback stack under torch.cuda.set_sync_debug_mode("error")
    the fused invertible coupling vs its compiled reference path under bf16 autocast
    2-GPU DDP through the real command line (skipped with fewer than 2 GPUs)
    bf16 gradients against fp32 per parameter tensor (a wrong backward moves a cosine far below 1)
    a checkpoint written by `fit` on CUDA read back on the CPU: the same weights, the GPU model's logits
The throughput, MFU, SDPA kernels, measured-vs-analytic memory and the FSDP2 resume are `make gpu-check`'s stages
(benchmarks/gpu_check.py).

None of this could run where it was written (no GPU lent): run `pytest -m gpu tests/gpu -q` on a GPU machine first.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU suite needs a CUDA device"),
]
REPO = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16

#: name -> (attention, options, can use a fused SDPA kernel in bf16: docs/backends table, audit section 2)
BACKENDS: dict[str, tuple[str, dict, bool]] = {
    "standard": ("standard", {}, True),
    "gqa": ("standard", {"n_kv_groups": 4}, True),
    "k_eq_v": ("standard", {"qkv_sharing": "k_eq_v"}, True),
    "q_eq_k": ("standard", {"qkv_sharing": "q_eq_k"}, True),
    "coupled": ("coupled", {}, True),
    "uncoupled_mlp": ("uncoupled_mlp", {}, True),
    "invertible": ("standard", {"qk_transform": {"kind": "invertible"}}, True),
    "differential": ("differential", {}, True),
    "mla": ("mla", {}, True),
    "static_emb_qk": ("static_emb_qk", {}, True),
    "rnd_emb_qk": ("rnd_emb_qk", {}, False),  # SDPA on batch-expanded (stride 0) q/k: kernel choice unverified
    "fixed_seq_qk": ("fixed_seq_qk", {}, False),
    "approximate": ("approximate", {}, False),  # no softmax: never calls SDPA
    "non_approximate": ("non_approximate", {}, False),
    "mlp": ("mlp", {}, False),
}


def _fused_kernels():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_backend_trains_200_steps_bf16(name, compiled):
    attention, options, fused = BACKENDS[name]
    torch.manual_seed(0)
    cfg = ModelConfig(preset="60m", block_size=1024, vocab_size=50304, attention=attention, attention_options=options)
    model = GPT(cfg).cuda()
    if compiled:  # a recompile-limit hit raises instead of running eager (tests/contract/test_compile_graphs.py)
        torch._dynamo.reset()
        counters.clear()
        for block in model.blocks:
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    with (
        _fused_kernels() if fused else torch.enable_grad(),
        torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
    ):
        for _ in range(200):
            batch = torch.randint(0, 50304, (4, 1025), device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=BF16):
                logits = model(batch[:, :-1])  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
    losses = torch.stack(losses).cpu()
    if compiled:  # compiled means compiled: its graphs were captured, and one serves every layer
        graphs = counters["stats"]["unique_graphs"]
        assert 1 <= graphs <= 3, f"{name}: {graphs} compiled graphs for {cfg.n_layer} layers"
    assert torch.isfinite(losses).all()
    assert losses[-20:].mean() < math.log(50304) + 0.5  # random tokens: near the uniform loss, not diverged


def test_fused_invertible_matches_compiled_bf16():
    from lightning_cqk.attention.transform import parse_transform
    from lightning_cqk.attention.transforms.coupling import InvertibleCoupling

    cfg = ModelConfig(preset="tiny", n_layer=1, n_head=4, n_embd=256, block_size=256)
    _, options = parse_transform({"kind": "invertible", "layers": 2})
    torch.manual_seed(0)
    fused = InvertibleCoupling(cfg, 0, options, 4, 64).cuda()
    with torch.no_grad():
        for p in fused.conditioners.parameters():
            p.normal_(0.0, 0.1)  # non-zero conditioners: the map is not the identity
    reference = InvertibleCoupling(cfg, 0, type(options)(**{**vars(options), "fused": False}), 4, 64).cuda()
    reference.load_state_dict(fused.state_dict())
    compiled = torch.compile(reference)
    q = torch.randn(2, 4, 256, 64, device="cuda", requires_grad=True)
    k = torch.randn(2, 4, 256, 64, device="cuda", requires_grad=True)
    outs, grads = [], []
    for module in (fused, compiled):
        with torch.autocast("cuda", dtype=BF16):
            q_b, k_b = q.to(BF16), k.to(BF16)
            q2, k2 = module(q_b, k_b)
        (q2.float().square().sum() + k2.float().sum()).backward()
        outs.append((q2.float(), k2.float()))
        grads.append([q.grad.clone(), k.grad.clone(), *(p.grad.clone() for p in module.parameters())])
        q.grad = k.grad = None
        module.zero_grad()
    for a, b in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    for a, b in zip(grads[0], grads[1], strict=True):
        assert (a - b).norm() / b.norm().clamp_min(1e-12) < 2e-2


def test_shipped_callbacks_do_not_sync_the_step(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from sync_probe import SyncErrorSteps

    from lightning_cqk.cli.trainer import CQKCLI

    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    args = [
        "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--trainer.max_steps=7", "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1000",
        "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--model.optim.warmup_steps=1", f"--data.data_dir={tmp_path / 'shards'}",
    ]  # fmt: skip
    cli = CQKCLI(args=args, run=False)
    probe = SyncErrorSteps(first=1, last=5)
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert probe.checked == 5
    assert sorted(probe.reads.values()) == [1] * 5, f"one documented read per optimizer step: {dict(probe.reads)}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="2-GPU DDP needs 2 CUDA devices")
def test_two_gpu_ddp_through_the_cli(tmp_path):
    cmd = [
        sys.executable, "-m", "lightning_cqk", "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.max_steps=20", "--trainer.limit_val_batches=2",
        "--trainer.val_check_interval=10", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        f"--data.data_dir={tmp_path / 'shards'}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checkpoints = list((tmp_path / "runs").rglob("last.ckpt"))
    assert len(checkpoints) == 1  # one run directory


@pytest.mark.parametrize("name", ["standard", "coupled", "invertible", "differential", "mla"])
def test_bf16_gradients_point_where_fp32_gradients_point(name):
    """A check that catches a wrong gradient (a sign, a missing term in a hand-written backward), which a finite
    loss does not: one batch's gradients under bf16 autocast against fp32, per parameter tensor, by cosine. bf16
    rounding leaves them close to 1 (> 0.98 here); a wrong term in a backward moves some tensor far below."""
    attention, options, _ = BACKENDS[name]
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", n_layer=4, block_size=256, vocab_size=50304, attention=attention,
                      attention_options=options)  # fmt: skip
    model = GPT(cfg).cuda()
    batch = torch.randint(0, 50304, (8, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    grads = []
    for autocast in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=BF16, enabled=autocast):
            logits = model(batch[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()).backward()
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    fp32, bf16 = grads
    assert fp32.keys() == bf16.keys()
    cosines = {n: torch.nn.functional.cosine_similarity(fp32[n].flatten(), bf16[n].flatten(), dim=0).item()
               for n in fp32 if fp32[n].norm() > 1e-8}  # fmt: skip
    worst = min(cosines, key=cosines.get)
    assert cosines[worst] > 0.98, f"{name}: {worst} bf16 vs fp32 gradient cosine {cosines[worst]:.4f}"


def test_a_checkpoint_saved_on_the_gpu_loads_on_a_cpu(tmp_path):
    """`fit` on CUDA, then `generate`'s loader (the CPU) reads its checkpoint: tensors come back on the CPU, the
    same weights, and the model built from it gives the GPU model's logits."""
    from lightning_cqk.inference.pretrained import load_pretrained

    cmd = [
        sys.executable, "-m", "lightning_cqk", "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--trainer.max_steps=5", "--trainer.limit_val_batches=0", f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--data.data_dir={tmp_path / 'shards'}", "--trainer.accelerator=cuda",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (ckpt,) = tmp_path.rglob("last.ckpt")
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    model = load_pretrained(ckpt).model
    assert all(p.device.type == "cpu" for p in model.parameters())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, saved[f"model.{name}"], rtol=0, atol=0, msg=name)
    idx = torch.randint(0, 257, (2, 32))
    with torch.no_grad():
        on_cpu = model(idx)
        on_gpu = load_pretrained(ckpt).model.cuda()(idx.cuda()).cpu()
    torch.testing.assert_close(on_cpu, on_gpu, rtol=1e-3, atol=1e-3)
