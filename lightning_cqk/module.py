"""The LightningModule: next-token loss, validation perplexity and bits per byte, AdamW (or Muon + AdamW, `optim.name`)
with warmup + cosine.

This is the only Lightning-aware model file; the network itself is `lightning_cqk.model.GPT` (torch only).

Metrics (TensorBoard names):
    train/loss         next-token cross-entropy of the current batch (nats/token)
    train/tokens_seen  target tokens trained on so far, all ranks together (logged on logging steps only)
    optim/quack/...    with model.optim.logit_control.method quack: mean per-head factor per role and layer
                       (`optim/quack/q/layer_03`, ...) and their min/max, every `log_every_n_steps`
    optim/qk_clip/...  with qk_clip: per layer the max logit measured at the last step and the heads clipped

`flops_seen` (analytic training FLOPs, `lightning_cqk.model.flops.training_flops_per_batch` of every batch trained,
all ranks together) is counted beside `tokens_seen` and saved in checkpoints; the TokenBudget and Throughput callbacks
log it. Both count the micro-batches trained into optimizer steps: a micro-batch's tokens are held until its step is
taken (`optimizer_step`) and dropped with its gradients when Lightning zeroes them before any step took it
(`optimizer_zero_grad`). With data shorter than the run and `accumulate_grad_batches` > 1, a resume at an epoch's end
replays the epoch's last micro-batches as a short epoch of their own that no step takes (their gradients are zeroed
at the next window): they were counted, and a stop + resume saw 2 micro-batches more than the uninterrupted run with
bit-identical weights (issue 45 item 9). A checkpoint never counts micro-batches whose gradients it does not hold.
    val/loss           token-weighted mean NLL over the whole validation set (nats/token)
    val/ppl            exp(val/loss)
    val/bpb            bits per byte of the validation text scored: summed NLL / ln 2 / the UTF-8 bytes of exactly the
                       target tokens scored (`data/token_bytes.py`: counted per batch, so right under
                       limit_val_batches; comparable across tokenizers). Not logged, with a warning, when the
                       tokenizer's vocabulary cannot be loaded offline (GPT-2 without data.bpe_file /
                       $LIGHTNING_CQK_GPT2_BPE): the scored bytes are then unknown.
    val/windows        the validation windows scored, all ranks together (with data.final_val_windows the final
                       validation scores more of them than the others: `data/val_sets.py`)
    val/ctx<c>/loss    with `eval_contexts`: token-weighted NLL when every token of each validation window is scored
    val/ctx<c>/ppl     with at most c tokens of context (sliding window, `sliding_window_nll`; stride `eval_stride`,
                       default c: non-overlapping). Longer validation windows: `data.val_seq_len` (then val/loss
                       scores them in non-overlapping block_size chunks).

A non-finite validation stays non-finite: the sums keep NaN/Inf (torchmetrics' SumMetric drops NaN by default, which
turned an all-NaN validation into val/loss 0.0, val/ppl 1.0), so val/loss, val/ppl and val/bpb are NaN or Inf, a
warning names the step, and `RunSummary` and `BestCheckpoint` see it
(tests/e2e/reliability/test_metrics_checkpoints.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics.aggregation import SumMetric

from lightning_cqk.data.token_bytes import token_byte_lengths
from lightning_cqk.errors import ConfigError
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import training_flops_per_batch
from lightning_cqk.model.loss import chunked_cross_entropy
from lightning_cqk.model.sharding import clip_grad_norm_, shard_gpt
from lightning_cqk.model_config import ModelConfig, upgrade_config_dict
from lightning_cqk.optim import OptimConfig, build_logit_control, build_optimizer, warmup_cosine
from lightning_cqk.optim.config import check_schedule, check_trainer_numbers
from lightning_cqk.optim.schedule import learning_rates_at_scheduler_step
from lightning_cqk.run.version_records import check_torch_features, require_torch


class LitLM(L.LightningModule):
    """Train a `GPT` language model whose attention backend is chosen by `config.attention`.

    Args:
        config: the model (shape preset, components, attention backend and options).
        optim: optimiser and learning-rate schedule.
        compile: compile each transformer block with `torch.compile` (regional compilation: state-dict keys are
            unchanged, so checkpoints load into eager models).
        eval_contexts: context lengths (each at most block_size) at which validation also reports perplexity,
            e.g. [128, 256, 512, 1024] (arXiv 2510.11602 Table 4); None: only the plain val/loss.
        eval_stride: sliding-window stride for `eval_contexts` (tokens newly scored per window); None: the context.
        activation_checkpointing: keep only each block's input in the forward and recompute its activations in
            backward (`torch.utils.checkpoint` per block, every strategy; the same numbers, about 1/3 more compute).
            Default off.
        meta_init: build the network on the meta device (no memory) and materialise it in `configure_model` on the
            trainer's device, with exactly the weights a CPU build with the same seed has (`GPT.materialize`). For
            large models under several processes (each rank would otherwise hold the full fp32 model on the host).
            Default off: the model is built at construction, usable without a Trainer.
        loss_chunk: tokens per chunk of the output head + cross-entropy (`chunked_cross_entropy`): the B x T x vocab
            logits are never held at once, nor in fp32. 0: the plain head and `F.cross_entropy` on fp32 logits.

    Sharding: under Lightning's `ModelParallelStrategy` (FSDP2; `--trainer.strategy ModelParallelStrategy` with
    `data_parallel_size` = the number of processes and `tensor_parallel_size: 1`) `configure_model` applies
    `model.sharding.shard_gpt` (one unit per block, bf16 parameters with fp32 gradient reduction under a bf16
    precision) and gradient clipping by norm works on the sharded gradients (`configure_gradient_clipping`).
    """

    def __init__(
        self,
        config: ModelConfig = ModelConfig(),  # noqa: B008 - a dataclass default gives the CLI its field defaults
        optim: OptimConfig = OptimConfig(),  # noqa: B008
        compile: bool = False,
        eval_contexts: list[int] | None = None,
        eval_stride: int | None = None,
        activation_checkpointing: bool = False,
        meta_init: bool = False,
        loss_chunk: int = 0,
    ) -> None:
        super().__init__()
        # Accept plain dicts too: that is how checkpoints store hyper-parameters (weights_only-loadable).
        config = ModelConfig(**upgrade_config_dict(config)) if isinstance(config, dict) else config
        optim = OptimConfig(**optim) if isinstance(optim, dict) else optim
        self.save_hyperparameters({"config": config.to_dict(), "optim": asdict(optim), "compile": compile})
        self.config, self.optim, self.compile_blocks = config, optim, compile
        self.activation_checkpointing, self.loss_chunk = activation_checkpointing, loss_chunk
        check_torch_features(config, optim)
        if isinstance(loss_chunk, bool) or not isinstance(loss_chunk, int) or loss_chunk < 0:
            raise ConfigError(
                f"loss_chunk={loss_chunk!r}; use 0 (no chunking) or a positive number of tokens, e.g. 4096."
            )
        if meta_init:
            with torch.device("meta"):
                self.model = GPT(config)
        else:
            self.model = GPT(config)
        # QuacK / fixed factor / QK-clip (None when off, so nothing changes): built on the initial weights, so after
        # materialisation with meta_init (in configure_model).
        self.logit_control = None if meta_init else build_logit_control(self.model, optim.logit_control)
        self._sharded = False
        # nan_strategy="disable": a NaN is summed like any value (the default drops it and biases the loss low).
        self.val_nll = SumMetric(nan_strategy="disable")
        self.val_tokens = SumMetric(nan_strategy="disable")
        self.val_bytes = SumMetric(nan_strategy="disable")  # UTF-8 bytes of the targets scored (val/bpb)
        self.val_window_count = SumMetric()  # windows scored (val/windows)
        # Set by ValWindowLosses for the validations it records: validation_step then also returns each window's
        # summed NLL, from the same batched forward (no second pass over the windows).
        self.window_nll_wanted = False
        self._token_bytes: torch.Tensor | None = None  # (vocab,) bytes per token id, set at the first validation
        self._bpb_problem: str | None = None
        self.eval_contexts, self.eval_stride = list(eval_contexts or []), eval_stride
        if any(c < 1 or c > config.block_size for c in self.eval_contexts) or not (
            0 < (eval_stride or 1) <= min(self.eval_contexts, default=1 << 62)
        ):
            raise ConfigError(
                f"eval_contexts must lie in [1, block_size={config.block_size}] and eval_stride in [1, the smallest "
                "context], got "
                f"{self.eval_contexts} and {eval_stride}."
            )
        self.ctx_nll = torch.nn.ModuleDict({str(c): SumMetric(nan_strategy="disable") for c in self.eval_contexts})
        self.ctx_tokens = torch.nn.ModuleDict({str(c): SumMetric(nan_strategy="disable") for c in self.eval_contexts})
        self.tokens_seen = 0  # of the micro-batches trained into optimizer steps (module docstring)
        self.flops_seen = 0
        self._pending_tokens = 0  # of this step's micro-batches so far: counted once the step is taken
        self._pending_flops = 0
        self._micro_batch = (0, 0)  # (tokens, FLOPs) of the micro-batch whose training_step ran last
        self._flops_per_batch: dict[tuple[int, int], int] = {}

    # ----------------------------------------------------------------------------------------------- model
    def configure_model(self) -> None:
        """Materialise (meta_init), build the logit control, activation checkpointing, compile, then FSDP2 under
        `ModelParallelStrategy`, in that order (torchtitan's). Idempotent: Lightning calls it on every entry."""
        device = self.trainer.strategy.root_device if self._trainer is not None else torch.device("cpu")
        if any(p.is_meta for p in self.model.parameters()):
            self.model.materialize(device)
        if self.logit_control is None and self.optim.logit_control.method != "none":
            self.logit_control = build_logit_control(self.model, self.optim.logit_control).to(device)
        self.model.activation_checkpointing = self.activation_checkpointing
        if self.compile_blocks:
            for block in self.model.blocks:
                if not hasattr(block, "_compiled_call_impl") or block._compiled_call_impl is None:
                    block.compile()
        mesh = self.device_mesh
        if mesh is not None and not self._sharded:
            self._shard(mesh)

    def _shard(self, mesh: Any) -> None:
        """FSDP2 over the data-parallel ranks of Lightning's mesh (`model.sharding.shard_gpt`)."""
        require_torch("fsdp2")
        from torch.distributed.fsdp import MixedPrecisionPolicy

        tensor_parallel = mesh["tensor_parallel"].size() if "tensor_parallel" in (mesh.mesh_dim_names or ()) else 1
        if tensor_parallel != 1:
            raise ConfigError(
                f"ModelParallelStrategy with tensor_parallel_size={tensor_parallel}: this framework shards the model "
                "with FSDP2 only (no tensor parallelism). Use --trainer.strategy.tensor_parallel_size 1 "
                "--trainer.strategy.data_parallel_size <number of processes>."
            )
        precision = str(getattr(self.trainer, "precision", "32-true")) if self._trainer is not None else "32-true"
        bf16 = precision.startswith("bf16")
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        self.model.to(self.trainer.strategy.root_device if self._trainer is not None else dp_mesh.device_type)
        shard_gpt(self.model, dp_mesh, policy)
        self._sharded = True

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Lightning's clipping; by norm on sharded (FSDP2) gradients with `model.sharding.clip_grad_norm_` (the
        global norm over all ranks, as on the unsharded model)."""
        if gradient_clip_val and (gradient_clip_algorithm or "norm") == "norm" and self._sharded:
            clip_grad_norm_(self.model.parameters(), float(gradient_clip_val))
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)  # (B, T, vocab)

    def loss(self, batch: torch.Tensor, reduction: str = "mean") -> tuple[torch.Tensor, int]:
        """Next-token cross-entropy of a (B, T + 1) token window batch, and the number of target tokens."""
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T) each
        if self.loss_chunk:
            hidden = self.model(x, head=False)  # (B, T, C)
            loss = chunked_cross_entropy(hidden, self.model.lm_head.weight, y, self.loss_chunk, reduction=reduction)
            return loss, y.numel()
        logits = self.model(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction=reduction)
        return loss, y.numel()

    # -------------------------------------------------------------------------------------------- training
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, n_tokens = self.loss(batch)
        world = self.trainer.world_size  # Python ints below: exact, and no device work at all
        self._micro_batch = (n_tokens * world, self.flops_per_batch(batch.size(0), batch.size(1) - 1) * world)
        self._pending_tokens += self._micro_batch[0]
        self._pending_flops += self._micro_batch[1]
        # Not prog_bar: Lightning converts progress-bar values to Python numbers after every batch (a host read);
        # the bars show train/loss on their own refresh (callbacks/progress.py), every log_every_n_steps.
        self.log("train/loss", loss)
        if self.trainer._logger_connector.should_update_logs:  # a new tensor (host-to-device copy) on log steps only
            self.log("train/tokens_seen", float(self.tokens_seen + self._pending_tokens))
        return loss

    def flops_per_batch(self, batch_size: int, seq_len: int) -> int:
        """Analytic training FLOPs of one micro-batch on one device (cached per shape; no tensors involved)."""
        key = (batch_size, seq_len)
        if key not in self._flops_per_batch:
            self._flops_per_batch[key] = training_flops_per_batch(self.config, batch_size, seq_len)
        return self._flops_per_batch[key]

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor] | None:
        """Add the batch to the validation sums; with `window_nll_wanted` return {"window_nll": (B,) summed NLL}."""
        window_nll = None
        if batch.size(1) - 1 > self.config.block_size:  # long windows (data.val_seq_len): block_size chunks
            size = self.config.block_size
            nll, n_tokens = sliding_window_nll(self.model, batch, size, size)
        elif self.window_nll_wanted and not self.loss_chunk:
            nll, n_tokens, window_nll = self._loss_per_window(batch)
        else:
            nll, n_tokens = self.loss(batch, reduction="sum")
        self.val_nll.update(nll)
        self.val_tokens.update(torch.tensor(float(n_tokens), device=nll.device))
        self.val_window_count.update(torch.tensor(float(batch.size(0)), device=nll.device))
        if self._token_bytes is not None:
            self.val_bytes.update(self._token_bytes[batch[:, 1:]].sum().float())  # bytes of the targets scored
        for c in self.eval_contexts:
            nll_c, n_c = sliding_window_nll(self.model, batch, c, self.eval_stride or c)
            self.ctx_nll[str(c)].update(nll_c)
            self.ctx_tokens[str(c)].update(torch.tensor(float(n_c), device=nll.device))
        return None if window_nll is None else {"window_nll": window_nll}

    def _loss_per_window(self, batch: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        """`loss(batch, "sum")` (the same operations, so the same bits) and each window's summed NLL, (B,), from
        the same logits: one cross-entropy more, no second forward."""
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self.model(x).flatten(0, 1).float()
        nll = F.cross_entropy(logits, y.flatten(), reduction="sum")
        per_window = F.cross_entropy(logits, y.flatten(), reduction="none").view(y.size(0), -1).sum(1)
        return nll, y.numel(), per_window

    def on_validation_start(self) -> None:
        if self._token_bytes is None and self._bpb_problem is None:
            self._token_bytes, self._bpb_problem = self._scored_bytes_table()
            if self._bpb_problem:
                rank_zero_warn(f"val/bpb is not logged: {self._bpb_problem}")

    def _scored_bytes_table(self) -> tuple[torch.Tensor | None, str | None]:
        """The (vocab,) bytes-per-token-id table of the data's tokenizer, or why there is none."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        tokenizer = getattr(datamodule, "tokenizer", None)
        if not isinstance(tokenizer, str):
            return None, ""  # no tokenizer named (a plain DataLoader): there is no text to count bytes of
        parts = getattr(datamodule, "parts", None) or []  # MixtureDataModule: its components know the file
        bpe_file = getattr(datamodule, "bpe_file", None) or next((getattr(p, "bpe_file", None) for p in parts), None)
        try:
            lengths = token_byte_lengths(tokenizer, bpe_file)
        except (OSError, RuntimeError, ValueError) as err:
            return None, f"the {tokenizer!r} vocabulary could not be loaded to count the bytes scored ({err})."
        if lengths is None:
            return None, (
                f"the {tokenizer!r} vocabulary is not available offline, so the bytes of the scored tokens are "
                "unknown. Give it with data.bpe_file or $LIGHTNING_CQK_GPT2_BPE (a gpt2.tiktoken file)."
            )
        if len(lengths) != self.config.vocab_size:
            return None, f"tokenizer {tokenizer!r} has {len(lengths)} ids, the model {self.config.vocab_size}."
        return torch.from_numpy(lengths).to(self.device), None

    def on_validation_epoch_end(self) -> None:
        n_tokens = self.val_tokens.compute()
        nll = self.val_nll.compute()
        self.val_nll.reset()
        self.val_tokens.reset()
        loss = nll / n_tokens.clamp_min(1.0)
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", loss.exp())
        self.log("val/windows", self.val_window_count.compute())
        self.val_window_count.reset()
        if self._token_bytes is not None:
            n_bytes = self.val_bytes.compute()
            self.val_bytes.reset()
            self.log("val/bpb", nll / math.log(2) / n_bytes.clamp_min(1.0))
        if not bool(torch.isfinite(loss.exp())) and not self.trainer.sanity_checking:  # NaN/Inf, or ppl overflows
            rank_zero_warn(
                f"Validation at step {self.trainer.global_step} is non-finite (val/loss {float(loss)}, val/ppl "
                f"{float(loss.exp())}): the model has "
                "diverged. Lower the learning rate and resume from a checkpoint written before the divergence "
                "(docs/reliability.md, 'Metrics and checkpoints')."
            )
        for c in self.eval_contexts:
            loss_c = self.ctx_nll[str(c)].compute() / self.ctx_tokens[str(c)].compute().clamp_min(1.0)
            self.ctx_nll[str(c)].reset()
            self.ctx_tokens[str(c)].reset()
            self.log(f"val/ctx{c}/loss", loss_c)
            self.log(f"val/ctx{c}/ppl", loss_c.exp())

    # ------------------------------------------------------------------------------------------ optimiser
    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim
        fused = cfg.fused and self.device.type == "cuda"
        # AdamW, or Muon for the hidden matrices + AdamW as one optimizer (optim/muon.py): Lightning's automatic
        # optimisation, gradient clipping, the one schedule below and the checkpoint format stay as they are.
        optimizer = build_optimizer(self.model, cfg, fused)
        # Without a Trainer (a plain loop calling this), model.optim.decay_steps alone sets the schedule's length.
        max_steps = self.trainer.max_steps if self._trainer is not None else None
        if max_steps == 0:
            raise ConfigError(
                "trainer.max_steps is 0: a budget of zero steps trains nothing. Set trainer.max_steps >= 1, or -1 "
                "with a budget (--budget.tokens / flops / wallclock) that sets it."
            )
        decay_steps = cfg.decay_steps or max_steps
        if decay_steps is None or decay_steps <= 0:
            raise ConfigError(
                "The learning-rate schedule needs a length: set trainer.max_steps or model.optim.decay_steps "
                f"(got max_steps={max_steps}, decay_steps={cfg.decay_steps})."
            )

        if self._trainer is not None:  # refuse a negative clip; warn when the warmup outlasts the run
            check_trainer_numbers(self.trainer)
            if (warning := check_schedule(cfg, decay_steps)) is not None:
                rank_zero_warn(warning)

        def schedule(step: int) -> float:
            return warmup_cosine(step, cfg.warmup_steps, decay_steps, cfg.min_lr_ratio)

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The Lightning step, wrapped by the Q/K update control when `optim.logit_control` is on.

        QuacK / fixed: the Q/K weights are snapshotted before `optimizer.step()` (the closure that runs forward and
        backward inside it changes no weight) and each head's update is rescaled after it. QK-clip: the heads whose
        logits exceeded the cap are rescaled after the step.
        """
        control = self.logit_control
        if control is None:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
            return self._count_trained_step()
        control.before_step(optimizer)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        control.after_step(optimizer)
        self._count_trained_step()
        step = self.trainer.fit_loop.epoch_loop._batches_that_stepped  # this step's index, as Lightning logs it
        if (step + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            self.log_dict(control.stats())
        return None

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Lightning zeroes the gradients at the first micro-batch of a window, right after its training_step: the
        micro-batches before it that no step took (an epoch that ended inside a window, replayed after a resume) are
        dropped with their gradients, so their tokens are not counted (module docstring)."""
        self._pending_tokens, self._pending_flops = self._micro_batch
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def _count_trained_step(self) -> None:
        """The step is taken (its last micro-batch ran inside it, in the closure): its micro-batches are trained."""
        self.tokens_seen += self._pending_tokens
        self.flops_seen += self._pending_flops
        self._pending_tokens = self._pending_flops = 0

    # ------------------------------------------------------------------------------------- checkpointing
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["tokens_seen"] = self.tokens_seen
        checkpoint["flops_seen"] = self.flops_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning calls this before loading the weights: a checkpoint of another model fails here, readably.
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        stage = getattr(getattr(self._trainer, "state", None), "fn", None)
        check_checkpoint_config(checkpoint, self.config, path, resuming=stage == "fit")
        saved_optim = (checkpoint.get("hyper_parameters") or {}).get("optim")
        if stage == "fit" and isinstance(saved_optim, dict) and checkpoint.get("optimizer_states"):
            saved_name = saved_optim.get("name", "adamw")  # checkpoints from before optim.name trained with AdamW
            if saved_name != self.optim.name:
                raise ConfigError(
                    f"Checkpoint {path or ''} was trained with optim.name {saved_name!r}, this run uses "
                    f"{self.optim.name!r}: its optimizer state cannot resume another optimizer. Resume with "
                    f"--model.optim.name {saved_name}, or drop --ckpt_path to train from scratch."
                )
        self.tokens_seen = int(checkpoint.get("tokens_seen", 0))
        self.flops_seen = int(checkpoint.get("flops_seen", 0))
        self._pending_tokens = self._pending_flops = 0  # a window the checkpoint does not hold is trained again

    def setup(self, stage: str) -> None:
        if stage == "fit" and self._trainer is not None:
            check_val_check_interval(self.trainer)
        seq_len = getattr(self.trainer.datamodule, "seq_len", None) if self._trainer is not None else None
        if seq_len is not None and seq_len > self.config.block_size:  # the CLI links them; a hand-built run may not
            raise ConfigError(
                f"data.seq_len={seq_len} is longer than the model's block_size={self.config.block_size}, the longest "
                "sequence it accepts. Use --data.seq_len <= block_size, or build the model with a block_size >= "
                "seq_len (the CLI links model.config.block_size to data.seq_len)."
            )

    def on_train_start(self) -> None:
        """After a restore: train the first resumed step at the rebuilt schedule's rate, not the checkpoint's."""
        learning_rates_at_scheduler_step(config.scheduler for config in self.trainer.lr_scheduler_configs)

    def on_fit_start(self) -> None:
        if self.logger is not None:  # hyper-parameters are logged by Lightning; sizes go beside them as scalars
            counts = self.model.num_parameters()
            self.logger.log_metrics({f"params/{k}": float(v) for k, v in counts.items()}, step=0)


def check_val_check_interval(trainer: L.Trainer) -> None:
    """Refuse `val_check_interval: 0` while validation is on, before any step (Lightning would fail after one), and an
    integer interval that is not a multiple of `accumulate_grad_batches` (Lightning counts it in training batches:
    validation would fall inside an accumulated step)."""
    interval = trainer.val_check_interval
    accumulate = getattr(trainer, "accumulate_grad_batches", 1) or 1
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0 and interval % accumulate:
        steps = max(1, round(interval / accumulate))
        raise ConfigError(
            f"trainer.val_check_interval={interval} is not a multiple of trainer.accumulate_grad_batches={accumulate}: "
            "Lightning counts val_check_interval in training batches, so validation would run in the middle of an "
            f"accumulated optimizer step. For a validation every {steps} optimizer steps use "
            f"--trainer.val_check_interval {steps * accumulate}."
        )
    if interval is None or isinstance(interval, bool) or interval != 0 or trainer.limit_val_batches == 0:
        return
    raise ConfigError(
        f"trainer.val_check_interval is {interval!r}: validation after every 0 training batches is not a "
        "schedule. Give the training batches between validations, e.g. --trainer.val_check_interval 100, or turn "
        "validation during training off with --trainer.limit_val_batches 0."
    )


# Fields that decide the weights' shapes or meaning: a checkpoint that differs in one of them is another model.
_ARCHITECTURE = (
    "n_layer",
    "n_head",
    "n_embd",
    "mlp_hidden",
    "vocab_size",
    "vocab_multiple",
    "norm",
    "ffn",
    "position",
    "bias",
    "tie_embeddings",
    "attention",
    "attention_options",
    "layer_overrides",
)


def check_checkpoint_config(checkpoint: dict[str, Any], config: ModelConfig, path: Any, resuming: bool) -> None:
    """Refuse a checkpoint whose model differs from `config` in architecture or vocabulary, before its weights load.

    Fields that change no weight (dropout, init_std, rope_base, norm_eps) may differ; so may block_size with RoPE or
    no positions, except when resuming a run (fit), where it would silently change the data's seq_len.
    """
    saved = (checkpoint.get("hyper_parameters") or {}).get("config")
    if not isinstance(saved, dict):
        return  # not a LitLM checkpoint: the weight loading reports what it finds
    saved = upgrade_config_dict(saved)  # a checkpoint of an older version: in today's field names
    current = config.to_dict()
    keys = list(_ARCHITECTURE)
    if resuming or config.position == "learned":
        keys.append("block_size")
    differ = [k for k in keys if k in saved and saved[k] != current[k]]
    if not differ:
        return
    detail = "; ".join(f"{k}: checkpoint {saved[k]!r}, this run {current[k]!r}" for k in differ)
    fix = "Use the configuration the checkpoint was trained with (`--config <its run dir>/config.yaml`)"
    if "vocab_size" in differ:
        fix += " (vocab_size follows data.tokenizer: use the tokenizer it was trained with)"
    if "block_size" in differ:
        fix += " (block_size follows data.seq_len)"
    raise ConfigError(
        f"Checkpoint {path or ''} holds another model than this run builds ({detail}). {fix}, or a checkpoint of "
        "this model; to train this model from scratch, drop --ckpt_path."
    )


def sliding_window_nll(
    model: torch.nn.Module, batch: torch.Tensor, context: int, stride: int
) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL of a (B, L + 1) token batch, every target scored once with at most ``context`` tokens.

    Windows of ``context`` tokens start every ``stride`` tokens; each scores only its targets that no earlier window
    scored (the first window scores all of its own), so a target's context is between ``context - stride + 1`` and
    ``context`` tokens once the first window is passed. ``stride == context``: non-overlapping windows.

    Returns:
        The summed NLL (fp32 scalar) and the number of targets scored (B * L).
    """
    x, y = batch[:, :-1], batch[:, 1:]  # (B, L) each
    length = x.size(1)
    total = torch.zeros((), device=batch.device, dtype=torch.float32)
    scored = 0
    begin = 0
    while scored < length:
        end = min(begin + context, length)
        new = end - scored  # targets [scored, end) are scored by this window
        logits = model(x[:, begin:end])[:, -new:]  # (B, new, vocab)
        total = total + F.cross_entropy(logits.flatten(0, 1).float(), y[:, end - new : end].flatten(), reduction="sum")
        scored = end
        begin = min(begin + stride, max(0, length - context)) if end < length else length
    return total, y.numel()
