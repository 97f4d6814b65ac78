"""AttentionStats: per-layer attention statistics on a fixed probe batch, every N steps, for every backend.

Metrics (per layer, layer index zero-padded to two digits):
    attn/max_logit/layer_03   largest |logit| (as the softmax sees it, scale included) over heads, positions and probe
                              sequences: the quantity QK-clip caps and QuacK / QK-norm keep in check
    attn/entropy/layer_03     mean attention entropy in nats (over heads, query positions and sequences)
    attn/sink/layer_03        mean weight on the first key ("attention sink" mass)
    attn/<stat>/layer_03      whatever the backend's `dynamics_stats()` returns: `lambda` (differential), `dt`
                              (coupled, uncoupled_mlp; with a per-head dt, `attn/dt/layer_03/head_01`, ...)
What a backend reports is its `AttentionBackend.probe(x, ctx)` (`lightning_cqk.attention.base`): the logit statistics
come from `attention_logits`, the explicit math path, whatever `impl` trains. Backends without a softmax map (`mlp`,
`approximate`) report only their dynamics (nothing, for those two); `differential` reports its nh half-head softmax
maps (each a proper distribution); `non_approximate` its pooling softmax; `rnd_emb_qk`/`fixed_seq_qk` their fixed
map.

Probe batch: the first `probe_batch_size` sequences of the first training batch this callback sees (truncated to
`probe_seq_len` tokens if set), kept on the device and in the callback's checkpoint state, so every measurement of a
run (resumed or not) uses the same tokens. The probe runs every `every_n_steps` optimizer steps (after the step) in
eval mode (no dropout) under `no_grad` and the trainer's precision context (bf16 autocast under bf16-mixed), with
the attention inputs collected by forward pre-hooks on every block's `attn`; regionally compiled blocks are run
eagerly for the probe (the hooks must fire). When the model also runs a fixed reference stream, a layer's last call
is the batch's (the stream runs first). All values are read with one host sync per probe.

Cost: one forward of probe_batch_size sequences plus a T x T logit map per layer, every every_n_steps steps; measured
in `seconds` (total time spent) and reported in docs/instruments.md ("Overheads").

Tests (`tests/e2e/callbacks/test_attention_stats.py`): values equal a hand computation from the weights on a tiny model
(max logit, entropy, sink); the keys of every backend per layer; logged in a Trainer run at the interval; finite under
bf16 autocast.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch import nn

from lightning_cqk.callbacks.common import is_log_step, log_metrics, step_index


@contextlib.contextmanager
def eager_blocks(model: nn.Module) -> Iterator[None]:
    """Run regionally compiled blocks (`block.compile()`) eagerly inside the context, so submodule hooks fire."""
    saved = [getattr(block, "_compiled_call_impl", None) for block in model.blocks]
    for block, compiled in zip(model.blocks, saved, strict=True):
        if compiled is not None:
            block._compiled_call_impl = None
    try:
        yield
    finally:
        for block, compiled in zip(model.blocks, saved, strict=True):
            if compiled is not None:
                block._compiled_call_impl = compiled


@torch.no_grad()
def attention_probe(model: nn.Module, idx: torch.Tensor) -> dict[int, dict[str, torch.Tensor]]:
    """Run `model` (a GPT) on token ids `idx` (B, T) and return every layer's `attn.probe(x, ctx)`, by layer index.

    The caller chooses mode and precision (AttentionStats uses eval mode and the trainer's autocast).
    """
    inputs: dict[int, tuple[torch.Tensor, Any]] = {}

    def keep(layer: int):
        def hook(module: nn.Module, args: tuple) -> None:
            inputs[layer] = (args[0], args[1])  # the last call wins: the batch runs after any reference stream

        return hook

    handles = [block.attn.register_forward_pre_hook(keep(i)) for i, block in enumerate(model.blocks)]
    try:
        with eager_blocks(model):
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    return {i: model.blocks[i].attn.probe(x, ctx) for i, (x, ctx) in sorted(inputs.items())}


def stats_to_metrics(stats: dict[int, dict[str, torch.Tensor]], prefix: str = "attn") -> dict[str, torch.Tensor]:
    """{layer: {stat: tensor}} -> {"attn/<stat>/layer_03": 0-dim tensor}; tensors with n > 1 values get /head_NN."""
    out: dict[str, torch.Tensor] = {}
    for layer, values in stats.items():
        for name, value in values.items():
            key = f"{prefix}/{name}/layer_{layer:02d}"
            value = value.detach()
            if value.numel() == 1:
                out[key] = value.reshape(())
            else:
                out.update({f"{key}/head_{h:02d}": v for h, v in enumerate(value.flatten())})
    return out


class AttentionStats(L.Callback):
    """Log per-layer attention statistics on a fixed probe batch every `every_n_steps` steps (module docstring).

    Args:
        every_n_steps: probe interval in optimizer steps.
        probe_batch_size: sequences in the probe batch (taken from the first training batch).
        probe_seq_len: tokens per probe sequence (None: the training sequence length).
        prefix: metric name prefix.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        probe_batch_size: int = 4,
        probe_seq_len: int | None = None,
        prefix: str = "attn",
    ) -> None:
        if every_n_steps < 1 or probe_batch_size < 1:
            raise ValueError("AttentionStats: every_n_steps and probe_batch_size must be >= 1.")
        self.every_n_steps = every_n_steps
        self.probe_batch_size = probe_batch_size
        self.probe_seq_len = probe_seq_len
        self.prefix = prefix
        self.probe_tokens: torch.Tensor | None = None  # (b, t + 1) token windows, as the training batches
        self.latest: dict[str, float] = {}
        self.seconds = 0.0  # total time spent probing
        self.calls = 0
        self._last_step = -1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.probe_tokens is None and isinstance(batch, torch.Tensor):
            probe = batch[: self.probe_batch_size]
            if self.probe_seq_len is not None:
                probe = probe[:, : self.probe_seq_len + 1]
            self.probe_tokens = probe.detach().clone()
        elif self.probe_tokens is not None and self.probe_tokens.device != pl_module.device:
            self.probe_tokens = self.probe_tokens.to(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, torch.Tensor]:
        """Probe statistics of the current weights as device tensors {"attn/max_logit/layer_00": ...}."""
        model = pl_module.model
        was_training = model.training
        model.eval()
        try:
            with trainer.precision_plugin.forward_context():
                stats = attention_probe(model, self.probe_tokens[:, :-1].to(pl_module.device))
        finally:
            model.train(was_training)
        return stats_to_metrics(stats, self.prefix)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._last_step or self.probe_tokens is None:
            return  # accumulating (or nothing to probe yet)
        self._last_step = trainer.global_step
        step = step_index(trainer)
        if not is_log_step(trainer, self.every_n_steps, step):
            return
        start = time.perf_counter()
        self.latest = log_metrics(trainer, self.measure(trainer, pl_module), step)  # includes the host read
        self.seconds += time.perf_counter() - start
        self.calls += 1

    def state_dict(self) -> dict[str, Any]:
        return {"probe_tokens": None if self.probe_tokens is None else self.probe_tokens.cpu()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.probe_tokens = state_dict.get("probe_tokens")
