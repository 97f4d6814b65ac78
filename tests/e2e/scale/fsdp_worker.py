"""Worker of tests/e2e/scale/test_fsdp.py, run under `torchrun --nproc_per_node 2` (gloo, CPU).

Part 1 (`parity`): for each case, one process's training (LitLM's loss, clipping at 1.0, the optimizer and the logit
control) on the full batch and the FSDP2-sharded model (`LitLM._shard`) on each rank's half of it, side by side for
a few steps: losses, gradients (gathered) and weights after each step must agree.
Part 2 (`resume`): Lightning `Trainer(strategy=ModelParallelStrategy)` for 4 steps in one go, and 2 + 2 with a
distributed checkpoint between: identical weights (exact).
Writes one JSON line per check to $OUT_FILE (rank 0).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from tiny_run import tiny_trainer

from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

VOCAB = 61
CASES = {
    "muon_quack_coupled": (
        {"attention": "coupled"},  # default coupled: scalar-per-layer dt, one dynamics bank shared by all layers
        {"name": "muon", "logit_control": {"method": "quack"}},
    ),
    "muon_only": ({"attention": "standard"}, {"name": "muon"}),
    "adamw_quack": ({"attention": "standard"}, {"name": "adamw", "logit_control": {"method": "quack"}}),
    "adamw_qkclip_invertible_shared": (
        {"attention": "standard", "attention_options": {"qk_transform": {"kind": "invertible", "share_layers": True}}},
        {"name": "adamw", "logit_control": {"method": "qk_clip", "tau_clip": 0.02}},  # a low cap: heads are clipped
    ),
}


def config(overrides: dict) -> ModelConfig:
    return ModelConfig(preset="tiny", n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=VOCAB, **overrides)


def full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def step(module: LitLM, optimizer, batch: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    optimizer.zero_grad(set_to_none=True)
    loss, _ = module.loss(batch)
    loss.backward()
    grads = [full(p.grad).clone() for p in module.model.parameters()]
    if module._sharded:
        from lightning_cqk.model.sharding import clip_grad_norm_

        clip_grad_norm_(module.model.parameters(), 1.0)
    else:
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), 1.0)
    control = module.logit_control
    if control is not None:
        control.before_step(optimizer)
    optimizer.step()
    if control is not None:
        control.after_step(optimizer)
    loss = loss.detach()
    if module._sharded:
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return float(loss), grads


def parity(out) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("data_parallel",))
    for name, (model_overrides, optim) in CASES.items():
        torch.manual_seed(7)
        single = LitLM(config(model_overrides), optim=OptimConfig(**optim, decay_steps=10, warmup_steps=1, lr=1e-2))
        torch.manual_seed(7)
        sharded = LitLM(
            config(model_overrides), optim=OptimConfig(**optim, decay_steps=10, warmup_steps=1, lr=1e-2), meta_init=True
        )
        sharded.configure_model()  # materialise on the CPU (same weights), logit control after it
        sharded._shard(mesh)
        opt_single = single.configure_optimizers()["optimizer"]
        opt_sharded = sharded.configure_optimizers()["optimizer"]
        gen = torch.Generator().manual_seed(3)
        # grad0: gradients of the first step (before any update) relative to their size; update1: the first update's
        # largest difference in units of the learning rate; loss: the largest difference over 3 steps.
        worst = {"loss": 0.0, "grad0": 0.0, "update1": 0.0}
        for i in range(3):
            batch = torch.randint(0, VOCAB, (4, 9), generator=gen)  # (B, T + 1)
            half = batch.chunk(world)[rank]
            loss_a, grads_a = step(single, opt_single, batch)
            loss_b, grads_b = step(sharded, opt_sharded, half)
            worst["loss"] = max(worst["loss"], abs(loss_a - loss_b))
            if i == 0:
                for a, b in zip(grads_a, grads_b, strict=True):
                    rel = float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))
                    worst["grad0"] = max(worst["grad0"], rel)
                for p, q in zip(single.model.parameters(), sharded.model.parameters(), strict=True):
                    diff = float((p.detach() - full(q.detach())).abs().max()) / 1e-2  # lr at step 0 (warmup 1)
                    worst["update1"] = max(worst["update1"], diff)
        clipped = None
        if optim.get("logit_control", {}).get("method") == "qk_clip":
            stats = sharded.logit_control.stats()
            clipped = float(sum(v for k, v in stats.items() if "clipped_heads" in k))
        if rank == 0:
            out.write(json.dumps({"check": "parity", "case": name, **worst, "clipped_heads": clipped}) + "\n")
            out.flush()


def resume(out, tmp: str, optim_name: str = "muon", method: str = "quack") -> None:
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    cfg = config({"attention": "coupled"})
    optim = OptimConfig(name=optim_name, logit_control={"method": method}, decay_steps=10, warmup_steps=1, lr=1e-2)
    gen = torch.Generator().manual_seed(5)
    data = torch.randint(0, VOCAB, (4, 9), generator=gen)  # 2 windows per rank: one step per epoch, every epoch alike

    def loader():
        from torch.utils.data import DataLoader

        return DataLoader(list(data.chunk(2)[dist.get_rank()]), batch_size=2, shuffle=False)

    def trainer(max_steps: int) -> L.Trainer:
        return tiny_trainer(
            devices=2,
            strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
            max_steps=max_steps,
            gradient_clip_val=1.0,
            enable_checkpointing=False,
            limit_val_batches=0,
            use_distributed_sampler=False,  # each rank reads its own half (loader())
        )

    def weights(module: LitLM) -> dict[str, torch.Tensor]:
        return {k: full(v.detach()).clone() for k, v in module.model.state_dict().items()}

    L.seed_everything(11)
    straight = LitLM(cfg, optim=optim, meta_init=True)
    t = trainer(4)
    t.fit(straight, train_dataloaders=loader())
    want = weights(straight)

    L.seed_everything(11)
    first = LitLM(cfg, optim=optim, meta_init=True)
    t = trainer(2)
    t.fit(first, train_dataloaders=loader())
    ckpt = os.path.join(tmp, "mid.ckpt")
    if os.path.isdir(ckpt):
        import shutil

        if dist.get_rank() == 0:
            shutil.rmtree(ckpt)
        dist.barrier()
    t.save_checkpoint(ckpt)
    L.seed_everything(11)
    second = LitLM(cfg, optim=optim, meta_init=True)
    t = trainer(4)
    t.fit(second, train_dataloaders=loader(), ckpt_path=ckpt)
    got = weights(second)
    worst = max(float((want[k] - got[k]).abs().max()) for k in want)
    sharded = any(type(p).__name__ == "DTensor" for p in second.model.parameters())
    if dist.get_rank() == 0:
        out.write(
            json.dumps(
                {
                    "check": "resume",
                    "optim": optim_name,
                    "max_abs_diff": worst,
                    "sharded": sharded,
                    "is_dir": os.path.isdir(ckpt),
                    "steps": t.global_step,
                }
            )
            + "\n"
        )
        out.flush()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = open(os.environ["OUT_FILE"], "a") if dist.get_rank() == 0 else sys.stdout
    parity(out)
    resume(out, os.environ["TMP_DIR"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
