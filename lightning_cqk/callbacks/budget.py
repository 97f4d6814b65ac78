"""TokenBudget: stop training at a budget of tokens, analytic FLOPs or wall-clock seconds, or at another run's budget.

Budgets (one at most; none makes the callback a recorder that only logs and writes `budget.json`):
    tokens=N     train max_steps = floor(N / tokens_per_step) whole optimizer steps, so the run stops at the largest
                 number of whole steps whose tokens do not exceed N (exactly N when N is a multiple of a step; the
                 step that would cross the budget is never started, never trained partly).
                 tokens_per_step = batch_size * seq_len * accumulate_grad_batches * world_size.
    flops=F      the same with flops_per_step = `training_flops_per_batch(model config, batch_size, seq_len)` (the
                 analytic count of the model's backends, `lightning_cqk.model.flops`) * accumulate * world_size.
    wallclock=S  stop at the first optimizer-step boundary at which the training time (validation and checkpoint
                 writing excluded: the run's `TrainingClock`, shared with Throughput and RunSummary) is >= S
                 seconds (a step in flight is finished; rank 0's clock decides for every rank).
    match_to=DIR, ratio=r, match_on=Q   read DIR/budget.json of a finished run and use r times its Q (tokens, flops,
                 wallclock or steps) as this run's budget: e.g. a standard-attention run gets 2.4 x the coupled
                 run's tokens, the compute-matched comparison of arXiv 2604.01683.
batch_size and seq_len come from the datamodule (`batch_size`, `seq_len`; as TokenDataModule) unless given here.
tokens, flops and steps budgets set `trainer.max_steps` in `setup`, which Lightning runs before
`configure_optimizers`, so the cosine schedule (which uses trainer.max_steps when `model.optim.decay_steps` is null)
decays over exactly the budget; the budget replaces a `trainer.max_steps` from the config. A wall-clock budget cannot
know its step count in advance: the schedule keeps `trainer.max_steps` (or `decay_steps`), so set one of them to at
least what fits in the time. Floating-point budgets are floored with a 1e-9 relative tolerance (2.4 x 320 tokens at
64 per step is 12 steps, not 11). As a guard the run also stops when the counted tokens (or FLOPs) plus one more step
would exceed the budget (e.g. a data loader that yields a smaller batch).

Metrics (every `every_n_steps`, default `trainer.log_every_n_steps`): `train/flops_seen`, `train/wallclock` (training
seconds of the `TrainingClock`: validation and checkpoints excluded; resumed runs continue the count) and
`train/tokens_seen` when the LightningModule does not log it itself (LitLM does). Counts come from the module's
`tokens_seen` / `flops_seen` (LitLM counts every trained batch, all ranks together) when it has them, else from
tokens_per_step / flops_per_step.

`budget.json` (written by this callback at the end of fit, or by RunSummary when no TokenBudget is present) records
what the run used: {"tokens", "flops", "wallclock", "steps", "tokens_per_step", "flops_per_step", "attempts",
"budget": {...}}. `attempts` lists each stretch of steps trained at one rate ({"from_step", "to_step",
"tokens_per_step", "flops_per_step", "accumulate_grad_batches", "world_size", "batch_size", "seq_len"}), and
`tokens_per_step` / `flops_per_step` are the rate when every trained step used the same one, else null (see
`attempts`). A fit that trains no step (a resume of a run already at its end) leaves an existing budget.json as it is.

Resumes (issue 25 class 3). The checkpoint keeps what was trained (tokens, FLOPs, steps) and the attempts. A resume
that changes the tokens of a step (`accumulate_grad_batches`, batch size, devices) plans the rest of a tokens or flops
budget at the new rate: max_steps = steps done + floor((budget - tokens done) / new tokens per step). This happens
when the checkpoint's callback states are restored, before the optimizer and schedule are configured (Lightning's
order), so the schedule decays over the new length; strategies that restore after configuring (FSDP, DeepSpeed) keep
the first plan's schedule length and only the stopping point moves (a warning says so).

Tests (`tests/e2e/callbacks/test_token_budget.py`): a budget of N tokens stops at floor(N / step) steps with tokens_seen
equal to that many steps' tokens and a schedule of that length; flops budget likewise; match_to reproduces the
reference budget times the ratio (tokens and flops across backends); a wall-clock budget stops early; budget.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_cqk.callbacks.clock import TrainingClock
from lightning_cqk.callbacks.common import is_log_step, log_metrics, run_dir, step_index, write_json

BUDGET_FILE = "budget.json"
QUANTITIES = ("tokens", "flops", "wallclock", "steps")


def read_budget(path: str | Path) -> dict[str, Any]:
    """The `budget.json` of a finished run (a run directory or the file itself)."""
    path = Path(path)
    file = path / BUDGET_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"TokenBudget.match_to: no {BUDGET_FILE} at {file}. Every run writes one into its run directory "
            "(runs/<experiment>/<run name>/) when fit ends; point match_to at a finished run."
        )
    return json.loads(file.read_text())


def per_step(
    trainer: L.Trainer, pl_module: L.LightningModule, batch_size: int | None = None, seq_len: int | None = None
) -> dict[str, int]:
    """Tokens and analytic training FLOPs of one optimizer step (all micro-batches, all ranks)."""
    dm = getattr(trainer, "datamodule", None)
    B = batch_size or getattr(dm, "batch_size", None)
    T = seq_len or getattr(dm, "seq_len", None) or getattr(getattr(pl_module, "config", None), "block_size", None)
    if not B or not T:
        raise ValueError(
            "TokenBudget needs the batch size and sequence length of a step: use a datamodule with `batch_size` and "
            "`seq_len` attributes (TokenDataModule has them) or pass batch_size and seq_len to TokenBudget."
        )
    scale = trainer.accumulate_grad_batches * trainer.world_size
    if hasattr(pl_module, "flops_per_batch"):
        flops = pl_module.flops_per_batch(B, T)
    else:
        from lightning_cqk.model.flops import training_flops_per_batch

        flops = training_flops_per_batch(pl_module.config, B, T)
    return {"tokens": B * T * scale, "flops": flops * scale, "batch_size": B, "seq_len": T}


def budget_record(trainer: L.Trainer, pl_module: L.LightningModule, wallclock: float, **extra: Any) -> dict[str, Any]:
    """What budget.json holds for a run that trained `trainer.global_step` steps in `wallclock` seconds."""
    return {
        "tokens": int(getattr(pl_module, "tokens_seen", 0)),
        "flops": int(getattr(pl_module, "flops_seen", 0)),
        "wallclock": float(wallclock),
        "steps": int(trainer.global_step),
        **extra,
    }


class TokenBudget(L.Callback):
    """Stop at a budget of tokens, FLOPs or seconds, or at `ratio` times a finished run's budget (module docstring).

    Args:
        tokens: token budget (all ranks together).
        flops: analytic training-FLOP budget.
        wallclock: training seconds (validation excluded).
        match_to: a finished run's directory (or its budget.json); the budget is `ratio` times its `match_on`.
        ratio: multiplier of the matched budget.
        match_on: which recorded quantity to match: "tokens", "flops", "wallclock" or "steps".
        batch_size: sequences per micro-batch per device; None reads the datamodule's `batch_size`.
        seq_len: tokens per sequence; None reads the datamodule's `seq_len` (or the model's block_size).
        every_n_steps: logging interval; None uses `trainer.log_every_n_steps`.
    """

    def __init__(
        self,
        tokens: int | float | None = None,
        flops: int | float | None = None,
        wallclock: int | float | None = None,
        match_to: str | None = None,
        ratio: float = 1.0,
        match_on: Literal["tokens", "flops", "wallclock", "steps"] = "tokens",
        batch_size: int | None = None,
        seq_len: int | None = None,
        every_n_steps: int | None = None,
    ) -> None:
        given = {
            k: v
            for k, v in {"tokens": tokens, "flops": flops, "wallclock": wallclock, "match_to": match_to}.items()
            if v is not None
        }
        if len(given) > 1:
            raise ValueError(f"TokenBudget takes one budget, got {sorted(given)}.")
        if match_on not in QUANTITIES:
            raise ValueError(f"TokenBudget.match_on={match_on!r} is not one of {QUANTITIES}.")
        for name, value in {"tokens": tokens, "flops": flops, "wallclock": wallclock, "ratio": ratio}.items():
            if value is not None and not value > 0:
                raise ValueError(
                    f"TokenBudget.{name} must be positive, got {value}: a budget of zero trains nothing. Give a "
                    f"positive {name} (e.g. --budget.{name} 2e6), or leave it unset (null) for no budget."
                )
        self.tokens, self.flops, self.wallclock = tokens, flops, wallclock
        self.match_to, self.ratio, self.match_on = match_to, ratio, match_on
        self.batch_size, self.seq_len, self.every_n_steps = batch_size, seq_len, every_n_steps
        self.kind: str | None = None  # resolved budget quantity
        self.amount: float | None = None  # resolved budget
        self.max_steps: int | None = None
        self.per_step: dict[str, int] = {}
        self.reference: dict[str, Any] | None = None
        self.clock: TrainingClock | None = None  # the run's one clock (training seconds, counts)
        self._restored_wallclock = 0.0  # from a checkpoint written before the clock kept its own state
        self._last_step = -1
        self._trainer: L.Trainer | None = None
        self._done: dict[str, float] | None = None  # trained before this fit (tokens, flops, steps), from a checkpoint
        self._attempts: list[dict[str, Any]] = []  # earlier stretches of steps at one rate, from a checkpoint
        self._fit_start: int | None = None  # global_step when this fit's training started (None: it never did)
        self._planned = False  # max_steps planned with what was trained before

    # ---------------------------------------------------------------------------------------- planning
    def resolve(self) -> tuple[str | None, float | None]:
        """(quantity, amount) of this run's budget; reads match_to's budget.json."""
        if self.match_to is not None:
            self.reference = read_budget(self.match_to)
            if self.match_on not in self.reference:
                raise ValueError(f"{self.match_to}: {BUDGET_FILE} has no {self.match_on!r} entry.")
            return self.match_on, self.ratio * float(self.reference[self.match_on])
        for kind in ("tokens", "flops", "wallclock"):
            if getattr(self, kind) is not None:
                return kind, float(getattr(self, kind))
        return None, None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.clock = TrainingClock.of(trainer)
        self._trainer = trainer
        if stage != "fit":
            return
        self.kind, self.amount = self.resolve()
        self.per_step = per_step(trainer, pl_module, self.batch_size, self.seq_len) if self.kind != "steps" else {}
        if self.kind in ("tokens", "flops", "steps"):
            unit = 1 if self.kind == "steps" else self.per_step[self.kind]
            steps = math.floor(self.amount / unit * (1 + 1e-9))
            if steps < 1:
                raise ValueError(
                    f"TokenBudget: a budget of {self.amount:g} {self.kind} is less than one optimizer step "
                    f"({unit:g} {self.kind})."
                )
            self.max_steps = steps
            if trainer.max_steps not in (-1, None, steps):
                rank_zero_info(f"TokenBudget: max_steps {trainer.max_steps} -> {steps} ({self.amount:g} {self.kind}).")
            trainer.fit_loop.epoch_loop.max_steps = steps
            if self._done is not None:  # restored before setup (not Lightning's order, but cheap to honour)
                self._plan_rest(trainer)

    def _plan_rest(self, trainer: L.Trainer) -> None:
        """A resume: the steps left are what the rest of the budget buys at this fit's rate (module docstring)."""
        self._planned = True
        if self.kind not in ("tokens", "flops") or not self.per_step or self._done is None:
            return
        done_steps, done = int(self._done["steps"]), float(self._done[self.kind])
        rate_now = self.per_step[self.kind]
        more = max(0, math.floor((self.amount - done) / rate_now * (1 + 1e-9)))
        steps = done_steps + more
        if steps != self.max_steps:
            rank_zero_info(
                f"TokenBudget: resumed at step {done_steps} with {done:g} of {self.amount:g} {self.kind} trained; "
                f"{more} more step(s) of {rate_now:g} {self.kind} fit the rest: max_steps {self.max_steps} -> {steps}."
            )
        self.max_steps = steps
        trainer.fit_loop.epoch_loop.max_steps = steps

    # ------------------------------------------------------------------------------------------ clock
    def elapsed(self) -> float:
        """Training seconds so far (validation and checkpoints excluded), earlier fits of a resumed run included."""
        return self.clock.total_seconds() if self.clock is not None else self._restored_wallclock

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        self._fit_start = trainer.global_step
        if self.clock is not None and not self.clock.earlier_seconds and self._restored_wallclock:
            self.clock.earlier_seconds = self._restored_wallclock  # a checkpoint without the clock's state
        if trainer.global_step and not self._planned and self.kind in ("tokens", "flops"):
            # Restored after the optimizer was configured, or a checkpoint without the trained counts: plan the rest
            # now from the module's counters (the schedule keeps its first length).
            seen = self.seen(trainer, pl_module)
            self._done = {"tokens": seen["tokens"], "flops": seen["flops"], "steps": trainer.global_step}
            self._plan_rest(trainer)
            rank_zero_warn(
                "TokenBudget: the rest of the budget was planned after the learning-rate schedule was configured; "
                "the schedule keeps its first length."
            )

    # ------------------------------------------------------------------------------------- per step
    def seen(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Tokens and FLOPs trained so far (the module's counters when it has them)."""
        steps = trainer.global_step
        return {
            "tokens": float(getattr(pl_module, "tokens_seen", steps * self.per_step.get("tokens", 0))),
            "flops": float(getattr(pl_module, "flops_seen", steps * self.per_step.get("flops", 0))),
        }

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._last_step:
            return  # accumulating: not an optimizer-step boundary
        self._last_step = trainer.global_step
        step = step_index(trainer)
        seen = self.seen(trainer, pl_module)
        stop = False
        if self.kind in ("tokens", "flops") and self.per_step:
            stop = seen[self.kind] + self.per_step[self.kind] > self.amount * (1 + 1e-9)
        elif self.kind == "wallclock":
            stop = self.elapsed() >= self.amount
            stop = bool(trainer.strategy.broadcast(stop))  # rank 0's clock decides for everyone
        if stop:
            trainer.should_stop = True
        if is_log_step(trainer, self.every_n_steps, step):
            metrics = {"train/flops_seen": seen["flops"], "train/wallclock": self.elapsed()}
            if not hasattr(pl_module, "tokens_seen"):
                metrics["train/tokens_seen"] = seen["tokens"]
            log_metrics(trainer, metrics, step)

    def attempts(self, trainer: L.Trainer) -> list[dict[str, Any]]:
        """The stretches of steps trained at one rate: the restored ones and this fit's (when it trained a step)."""
        out = [dict(a) for a in self._attempts]
        start = self._fit_start
        if start is not None and trainer.global_step > start and self.per_step:
            out.append(
                {
                    "from_step": start,
                    "to_step": trainer.global_step,
                    "tokens_per_step": self.per_step.get("tokens"),
                    "flops_per_step": self.per_step.get("flops"),
                    "accumulate_grad_batches": trainer.accumulate_grad_batches,
                    "world_size": trainer.world_size,
                    "batch_size": self.per_step.get("batch_size"),
                    "seq_len": self.per_step.get("seq_len"),
                }
            )
        return out

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = run_dir(trainer) / BUDGET_FILE
        if (self._fit_start is None or trainer.global_step == self._fit_start) and path.is_file():
            rank_zero_info(f"TokenBudget: this fit trained no step; {path} stays as the fit that trained wrote it.")
            return
        budget = {"kind": self.kind, "amount": self.amount, "max_steps": self.max_steps}
        if self.match_to is not None:
            budget.update({"match_to": str(self.match_to), "ratio": self.ratio, "match_on": self.match_on})
        attempts = self.attempts(trainer)
        rates = {(a["tokens_per_step"], a["flops_per_step"]) for a in attempts}
        tokens_rate, flops_rate = rates.pop() if len(rates) == 1 else (None, None)
        record = budget_record(
            trainer,
            pl_module,
            self.elapsed(),
            tokens_per_step=tokens_rate,
            flops_per_step=flops_rate,
            attempts=attempts,
            budget=budget,
        )
        write_json(path, record)

    # ----------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"wallclock": self.elapsed()}
        trainer = self._trainer
        if trainer is not None and trainer.lightning_module is not None:
            seen = self.seen(trainer, trainer.lightning_module)
            state["trained"] = {"tokens": seen["tokens"], "flops": seen["flops"], "steps": trainer.global_step}
            state["attempts"] = self.attempts(trainer)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_wallclock = float(state_dict.get("wallclock", 0.0))
        self._attempts = [dict(a) for a in state_dict.get("attempts", [])]
        if state_dict.get("trained") is not None:
            self._done = {k: float(v) for k, v in state_dict["trained"].items()}
            if self._trainer is not None and self.per_step:  # Lightning's order: after setup, before the optimizer
                self._plan_rest(self._trainer)
