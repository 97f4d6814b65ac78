"""Optimiser and learning-rate schedule settings (names and numbers only), and the checks of those numbers.

A number that cannot mean what it says is refused when the config is built, naming the setting, the value and the
range (issue 13, class 10): a negative weight decay (which would grow the weights), a non-positive or non-finite
learning rate, betas outside [0, 1), a non-positive eps, a negative warmup, a decay length below one step, a warmup
longer than an explicit decay length. ``check_trainer_numbers`` does the same for the Trainer's gradient clipping
(Lightning accepts a negative ``gradient_clip_val`` and then silently does not clip), and ``check_schedule`` warns
when the warmup is as long as the run or longer (the learning rate never leaves its warmup).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_cqk.errors import ConfigError

LOGIT_CONTROL_METHODS = ("none", "quack", "fixed", "qk_clip")
OPTIMIZERS = ("adamw", "muon")
ADJUST_LR_FNS = ("original", "match_rms_adamw", "spectral_unclamped")


@dataclass
class LogitControl:
    """Control of the query/key weights' updates (arXiv 2511.21377; `lightning_cqk.optim.quack`, `.qk_clip`).

    Applies to every layer whose backend has per-head Q/K matrices (`standard`, `coupled`, `uncoupled_mlp`, `mla`);
    QK-norm, the fourth intervention of the paper, is the backend option `qk_norm`.

    Attributes:
        method: "none" (the optimizer's own update, the default), "quack" (per-head Q/K learning rates
            tau * lr * |W_K^h|_0 / |W_K^h| and the mirror rule, recomputed before every step; the MLA rule for `mla`),
            "fixed" (the paper's "Ablation": a constant factor tau on the Q/K learning rate) or "qk_clip" (after every
            step, rescale W_Q^h, W_K^h of each head whose max logit since the last step exceeded tau_clip).
        tau: QuacK's relative initial Q/K learning rate (every factor equals tau at init), and the constant of
            "fixed". The paper sweeps 0.01, 0.1, 1 and 10.
        tau_clip: the logit cap of "qk_clip" (the paper tries 30 and 100).
        scale_weight_decay: "quack"/"fixed": True scales the whole AdamW update of W_Q, W_K, including the decoupled
            weight decay (a true per-head learning rate); False keeps the decay at the scheduled learning rate.
    """

    method: Literal["none", "quack", "fixed", "qk_clip"] = "none"
    tau: float = 1.0
    tau_clip: float = 100.0
    scale_weight_decay: bool = True

    def __post_init__(self) -> None:
        if self.method not in LOGIT_CONTROL_METHODS:
            raise ValueError(
                f"optim.logit_control.method={self.method!r} is not one of "
                f"{', '.join(map(repr, LOGIT_CONTROL_METHODS))}."
            )
        if not 0 < self.tau < math.inf:
            raise ValueError(f"optim.logit_control.tau must be positive and finite, got {self.tau}.")
        if not 0 < self.tau_clip < math.inf:
            raise ValueError(f"optim.logit_control.tau_clip must be positive and finite, got {self.tau_clip}.")


@dataclass
class MuonSettings:
    """Settings of Muon (`torch.optim.Muon`) for the hidden matrices when `optim.name` is "muon".

    arXiv 2511.21377 (QuacK) trains with Muon but states none of these [NS] (docs/papers.md §3), apart from
    one base learning rate eta "for all parameters", swept over 3e-4, 3e-3, 3e-2. The defaults therefore follow
    Moonlight (J. Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982), whose update-RMS matching
    makes one learning rate and weight decay serve Muon and AdamW alike, with torch's / K. Jordan's values for the
    iteration itself.

    Attributes:
        lr: Muon's peak learning rate; None: `optim.lr` (one rate for all parameters, as the QuacK paper). The
            schedule (warmup, cosine, floor) scales it as it scales AdamW's.
        weight_decay: Muon's decoupled weight decay (theta <- theta (1 - lr wd), with the unadjusted lr, as torch);
            None: `optim.weight_decay` (Moonlight uses 0.1 for both).
        momentum: momentum mu (0.95: torch, K. Jordan, Moonlight).
        nesterov: Nesterov momentum (True: torch, K. Jordan, Moonlight).
        ns_steps: Newton-Schulz iterations (5: all three).
        ns_coefficients: quintic Newton-Schulz coefficients (a, b, c) (torch's / K. Jordan's 3.4445, -4.7750, 2.0315).
        eps: added to the norm the momentum is divided by before the iteration (torch's 1e-7).
        adjust_lr_fn: shape scaling of Muon's step, `torch.optim.Muon`'s names: "match_rms_adamw" (the default here,
            Moonlight: lr * 0.2 sqrt(max(A, B)) for an A x B matrix, update RMS about AdamW's, so `optim.lr` tuned for
            AdamW carries over), "original" (K. Jordan: lr * sqrt(max(1, A / B)); use with its own lr, about 0.02,
            e.g. `muon: {lr: 0.02, adjust_lr_fn: original}`) or "spectral_unclamped" (J. Bernstein: lr sqrt(A / B)).
    """

    lr: float | None = None
    weight_decay: float | None = None
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    eps: float = 1e-7
    adjust_lr_fn: Literal["original", "match_rms_adamw", "spectral_unclamped"] = "match_rms_adamw"

    def __post_init__(self) -> None:
        self.ns_coefficients = tuple(self.ns_coefficients)
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"optim.muon.lr must be positive or null (use optim.lr), got {self.lr}.")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(
                f"optim.muon.weight_decay must be >= 0 or null (use optim.weight_decay), got {self.weight_decay}."
            )
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"optim.muon.momentum must be in [0, 1), got {self.momentum}.")
        if not 1 <= self.ns_steps < 100:
            raise ValueError(f"optim.muon.ns_steps must be in [1, 99] (torch's limit), got {self.ns_steps}.")
        if len(self.ns_coefficients) != 3:
            raise ValueError(f"optim.muon.ns_coefficients must be three numbers (a, b, c), got {self.ns_coefficients}.")
        if self.adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(
                f"optim.muon.adjust_lr_fn={self.adjust_lr_fn!r} is not one of {', '.join(map(repr, ADJUST_LR_FNS))}."
            )


@dataclass
class OptimConfig:
    """AdamW (or Muon for the hidden matrices + AdamW), linear warmup and cosine decay to a floor.

    Attributes:
        name: "adamw" (every parameter) or "muon": `torch.optim.Muon` for the 2-D hidden weight matrices of the
            blocks, AdamW for the token embedding, output head, position table, norm gains, biases and every
            parameter that is not 2-D (`lightning_cqk.optim.muon`; Muon's own settings: `muon`).
        muon: `MuonSettings` (used with name "muon").
        lr: peak learning rate (of AdamW; of Muon too unless `muon.lr` is set).
        betas: AdamW betas.
        eps: AdamW epsilon.
        weight_decay: decoupled weight decay, applied to parameters with 2 or more dimensions only (matrices:
            projections, embeddings, per-head MLP banks); vectors and scalars (norm gains, biases, lambda, dt) are
            never decayed (see `weight_decay_scope`).
        weight_decay_scope: "matrices" (the rule above, the default) or "all" (every parameter decayed, as the official
            code of arXiv 2606.04032).
        warmup_steps: linear warmup from 0 to `lr` over this many optimizer steps.
        min_lr_ratio: the cosine decays to `lr * min_lr_ratio`.
        decay_steps: length of warmup + cosine in optimizer steps; None uses `trainer.max_steps`. After it the
            learning rate stays at the floor.
        fused: use the fused AdamW kernel on CUDA (ignored elsewhere).
        logit_control: QuacK, the fixed Q/K factor or QK-clip (`LogitControl`); off by default.
    """

    name: Literal["adamw", "muon"] = "adamw"
    muon: MuonSettings = field(default_factory=MuonSettings)
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    weight_decay_scope: Literal["matrices", "all"] = "matrices"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    decay_steps: int | None = None
    fused: bool = True
    logit_control: LogitControl = field(default_factory=LogitControl)

    def __post_init__(self) -> None:
        if isinstance(self.logit_control, dict):  # checkpoints store plain dicts
            self.logit_control = LogitControl(**self.logit_control)
        if isinstance(self.muon, dict):
            self.muon = MuonSettings(**self.muon)
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optim.name={self.name!r} is not one of {', '.join(map(repr, OPTIMIZERS))}.")
        if self.weight_decay_scope not in ("matrices", "all"):
            raise ValueError(f"optim.weight_decay_scope={self.weight_decay_scope!r} is not 'matrices' or 'all'.")
        self.betas = tuple(self.betas)
        check_optim_numbers(self)


def _refuse(name: str, value: Any, rule: str, fix: str = "") -> None:
    raise ConfigError(f"{name}={value!r} is not allowed: {rule}.{' ' + fix if fix else ''}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_optim_numbers(cfg: OptimConfig) -> None:
    """Refuse optimiser numbers outside their meaningful range (see the module docstring)."""
    if not (_finite(cfg.lr) and cfg.lr > 0):
        _refuse("optim.lr", cfg.lr, "the learning rate must be positive and finite", "Give e.g. --model.optim.lr 6e-4.")
    if not (_finite(cfg.weight_decay) and cfg.weight_decay >= 0):
        _refuse(
            "optim.weight_decay",
            cfg.weight_decay,
            "decoupled weight decay must be >= 0 and finite (a negative one grows the weights every step)",
            "Use 0 for no decay: --model.optim.weight_decay 0.",
        )
    if len(cfg.betas) != 2 or not all(_finite(b) and 0.0 <= b < 1.0 for b in cfg.betas):
        _refuse(
            "optim.betas",
            list(cfg.betas),
            "AdamW needs two betas in [0, 1) (a beta of 1 never forgets, above 1 diverges)",
            "Give e.g. --model.optim.betas '[0.9, 0.95]'.",
        )
    if not (_finite(cfg.eps) and cfg.eps > 0):
        _refuse("optim.eps", cfg.eps, "AdamW's eps must be positive and finite", "Give e.g. --model.optim.eps 1e-8.")
    if not (isinstance(cfg.warmup_steps, int) and cfg.warmup_steps >= 0):
        _refuse("optim.warmup_steps", cfg.warmup_steps, "the warmup must be a whole number of steps >= 0")
    if not (_finite(cfg.min_lr_ratio) and 0.0 <= cfg.min_lr_ratio <= 1.0):
        _refuse("optim.min_lr_ratio", cfg.min_lr_ratio, "the floor of the cosine is a fraction of lr, in [0, 1]")
    if cfg.decay_steps is not None:
        if not (isinstance(cfg.decay_steps, int) and cfg.decay_steps >= 1):
            _refuse(
                "optim.decay_steps",
                cfg.decay_steps,
                "the schedule length must be >= 1 step",
                "Leave it unset (null) to use trainer.max_steps.",
            )
        if cfg.warmup_steps > cfg.decay_steps:
            _refuse(
                "optim.warmup_steps",
                cfg.warmup_steps,
                f"it is longer than optim.decay_steps={cfg.decay_steps}, so the peak learning rate would never be "
                "reached and the cosine never run",
                f"Use --model.optim.warmup_steps <= {cfg.decay_steps}, or a longer --model.optim.decay_steps.",
            )


def check_trainer_numbers(trainer: Any) -> None:
    """Refuse a negative or non-finite ``gradient_clip_val`` (Lightning accepts it and silently does not clip).

    0 and None both mean "no clipping", as in Lightning.
    """
    clip = getattr(trainer, "gradient_clip_val", None)
    if clip is not None and not (_finite(clip) and clip >= 0):
        _refuse(
            "trainer.gradient_clip_val",
            clip,
            "the clipping threshold must be >= 0 and finite (Lightning would silently not clip)",
            "Give a positive norm, e.g. --trainer.gradient_clip_val 1.0, or 0 / null for no clipping.",
        )


def check_schedule(cfg: OptimConfig, decay_steps: int) -> str | None:
    """A warning when the warmup lasts as long as the schedule the run resolved (``trainer.max_steps``), or longer;
    else None. The learning rate then never gets past its warmup (a paper config's 500 warmup steps in a 200-step
    CPU run stay below 0.4 x lr, and the run does not learn), so the warning says so and gives a scaled warmup.

    Not refused: a short smoke run of a long config is a legitimate use; the warning says what the run will do.
    """
    if cfg.warmup_steps >= decay_steps:
        peak = min(1.0, decay_steps / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        scaled = max(1, decay_steps // 10)
        return (
            f"THE LEARNING RATE NEVER LEAVES ITS WARMUP: optim.warmup_steps={cfg.warmup_steps} is at least the "
            f"schedule's {decay_steps} steps (trainer.max_steps / optim.decay_steps), so the learning rate rises to "
            f"at most {peak:.3g} x lr={cfg.lr:g} and the cosine decay never runs; such a run learns little. Scale the "
            f"warmup with the run, e.g. --model.optim.warmup_steps {scaled} (a tenth of it)."
        )
    return None
