"""`make bench`: one table of every speed figure, each measured side by side in one run, as a ratio and in absolutes.

    python benchmarks/bench.py                                   # CPU here: tiny/bytes and tiny/gpt2, ~18 min
    python benchmarks/bench.py --presets 60m:gpt2:16x1024 150m:gpt2:8x1024   # GPU (bf16 by default there)
    python benchmarks/bench.py --only backends --backends standard coupled --steps 20
    python benchmarks/bench.py --only backends --backends standard+invertible differential+invertible --threads 2
    python benchmarks/bench.py --only backends --presets tiny:bytes:8x256 --n_embd 256 --mlp_hidden 1024   # hs 64

Rows (per preset `name:tokenizer:BxT`):
    framework   tokens/s of a training step (forward + backward + clip + AdamW + schedule) through the Lightning
                Trainer (`LitLM`, a TensorBoard logger, gradient clipping as the quickstart) vs a plain PyTorch loop
                over the same model, optimiser, batches and DataLoader. Per-step time = interval between consecutive
                step ends, so data fetching and every Lightning hook are inside it. Target >= 0.95x.
    backends    every attention backend's step time (forward + backward + AdamW, random tokens) and memory vs
                `standard`, same preset and batch. Memory: "activations" = bytes allocated by the forward and still
                alive when it returns (what autograd keeps for backward, logits and loss included), "peak" = the
                step's peak allocation above the resting state (parameters, gradients of the previous step freed,
                optimiser state). On CPU both come from the allocation events of `torch.profiler` (profile_memory),
                on CUDA from `torch.cuda.memory_allocated` / `max_memory_allocated`. Both count real allocations, so
                recomputation (checkpointing) is credited honestly. Targets: coupled <= 1.10x time and activations,
                differential <= 1.25x, k_eq_v <= 1.0x. Compositions `<base>+<transform>` (base: standard, gqa,
                differential, mla; transform: coupled, invertible; `lightning_cqk.attention.transform`) are compared
                with their own base, measured in the same interleaved rounds: target <= 1.10x. On CUDA, MFU =
                analytic training FLOPs of the actual backends (`lightning_cqk.model.flops`) / step time / the
                device's dense peak for the dtype.
    loader      tokens/s of the real training DataLoader (`TokenDataModule`, litdata shards prepared here) vs the
                tokens/s the Lightning step consumes at that preset. Target >= 20x.
    prepare     `lightning_cqk prepare` end to end (read, split, tokenize, write shards) with the GPT-2 tokenizer
                and one worker: MB of UTF-8 text per second per worker. Target >= 3 MB/s.
    inference   every backend (and k_eq_v, q_mqa, mqa, gqa) vs `standard` (benchmarks/bench_inference.py):
                measured KV-cache bytes per token, which must equal the analytic count (`kv_cache_values_per_token`
                x element size; Q-K=V exactly 0.5x standard, Q-MQA exactly 1 / (2 n_head)); prefill tokens/s of the
                B x T prompt; decode tokens/s after it (--decode_steps); peak memory of decoding --decode_tokens
                (1,024) tokens; standard's `generate_reference` (no cache) vs `generate` (KV cache). Eager
                (no --compile), the model cast to the bench dtype.

Every figure is the median of repeated measurements after warm-up; the compared runs are interleaved (round-robin
per repetition: Lightning and plain loop alternate, backends take turns), so a change of machine load hits all of
them alike. The header prints `os.getloadavg()` at the start and the end: ratios are robust to a busy machine,
absolute numbers are not.

The gpt2 rows of prepare and loader (which tokenize text) need the GPT-2 vocabulary: --bpe_file,
$LIGHTNING_CQK_GPT2_BPE, ../shared/data/gpt2_bpe/gpt2.tiktoken beside the repository, or tiktoken's download (online).
Without any of them the default presets run without their gpt2 rows and the table says so in one line; presets that
name gpt2 explicitly stop with that line. backends, framework and inference draw random ids below the vocabulary size
and need no file. backends keeps every variant's model resident and times them round-robin while their states fit
half the GPU's memory, else one variant at a time (`resident_groups`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_inference import INFERENCE_VARIANTS  # noqa: E402  (beside this file)

from lightning_cqk import attention  # noqa: E402
from lightning_cqk.callbacks.throughput import device_peak_flops  # noqa: E402
from lightning_cqk.data.tokenizers import vocab_size_of  # noqa: E402
from lightning_cqk.model import GPT  # noqa: E402
from lightning_cqk.model.flops import training_flops_per_batch  # noqa: E402
from lightning_cqk.model_config import ModelConfig  # noqa: E402
from lightning_cqk.optim import OptimConfig, weight_decay_groups  # noqa: E402

#: Backend variants compared besides the registry's backends (label -> backend name and options).
VARIANTS: dict[str, tuple[str, dict]] = {
    "k_eq_v": ("standard", {"qkv_sharing": "k_eq_v"}),
    "coupled_qk": ("coupled", {"recompute": "qk"}),  # keeps nothing beyond standard, recomputes the q/k projections
    "gqa": ("standard", {"n_kv_groups": 2}),
}
#: The q/k transforms of `lightning_cqk.attention.transform`, composed with each base mechanism: one row per
#: composition, its ratio against its own base (issue 15: at most 1.10x the base backend's step).
TRANSFORM_SPECS = {"coupled": {"kind": "coupled"}, "invertible": {"kind": "invertible"}}
COMPOSITION_BASES = ("standard", "gqa", "differential", "mla")
BASES: dict[str, str] = {}
for _base in COMPOSITION_BASES:
    _name, _options = VARIANTS.get(_base, (_base, {}))
    for _kind, _spec in TRANSFORM_SPECS.items():
        VARIANTS[f"{_base}+{_kind}"] = (_name, {**_options, "qk_transform": _spec})
        BASES[f"{_base}+{_kind}"] = _base
#: Issue 9's targets: (row kind, label) -> (comparison, bound).
TARGETS: dict[tuple[str, str], tuple[str, float]] = {
    ("framework", "lightning"): (">=", 0.95),
    ("framework", "callbacks"): (">=", 0.95),  # issue 24: the shipped callbacks cost at most 5%
    ("time", "coupled"): ("<=", 1.10),
    ("act", "coupled"): ("<=", 1.10),
    ("time", "differential"): ("<=", 1.25),
    ("time", "k_eq_v"): ("<=", 1.00),
    **{("time", label): ("<=", 1.10) for label in BASES},
    ("loader", "loader"): (">=", 20.0),
    ("prepare", "gpt2"): (">=", 3.0),
}
SECTIONS = ("framework", "backends", "loader", "prepare", "inference")
#: Model shape fields set from the command line (--n_layer, --n_embd, --n_head, --mlp_hidden), over the preset's.
SHAPE_OVERRIDES: dict[str, int] = {}


@dataclass
class Preset:
    """One benchmark shape: a model preset with a tokenizer's vocabulary, at batch B x T."""

    preset: str
    tokenizer: str
    batch: int
    seq_len: int

    @classmethod
    def parse(cls, spec: str) -> Preset:
        try:
            preset, tokenizer, shape = spec.split(":")
            batch, seq_len = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--presets: {spec!r} is not preset:tokenizer:BxT, e.g. tiny:bytes:16x256") from None
        vocab_size_of(tokenizer)  # validates the name
        return cls(preset, tokenizer, batch, seq_len)

    @property
    def label(self) -> str:
        return f"{self.preset}/{self.tokenizer} {self.batch}x{self.seq_len}"

    def config(self, attention_name: str = "standard", options: dict | None = None) -> ModelConfig:
        return ModelConfig(
            preset=self.preset,
            vocab_size=vocab_size_of(self.tokenizer),
            block_size=self.seq_len,
            attention=attention_name,
            attention_options=dict(options or {}),
            **SHAPE_OVERRIDES,
        )

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


@dataclass
class Row:
    """One line of the table."""

    preset: str
    measure: str
    value: str
    reference: str = "-"
    ratio: float | None = None
    key: tuple[str, str] | None = None  # into TARGETS
    mfu: str = "-"
    notes: list[str] = field(default_factory=list)
    exact: tuple[str, bool] | None = None  # (what must hold, whether it does): an equality check, not a bound

    def verdict(self) -> tuple[str, str]:
        if self.exact is not None:
            return self.exact[0], "ok" if self.exact[1] else "MISSED"
        if self.key not in TARGETS or self.ratio is None:
            return "-", ""
        op, bound = TARGETS[self.key]
        ok = self.ratio >= bound if op == ">=" else self.ratio <= bound
        return f"{op} {bound:g}{'' if self.key[0] == 'prepare' else 'x'}", "ok" if ok else "MISSED"


# ----------------------------------------------------------------------------------------------------------- helpers
def progress(message: str) -> None:
    """One line on stderr, so a long run shows where it is without mixing into the table on stdout."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Clock:
    """Timestamps of step ends; on CUDA the device is synchronised first, so a step's kernels count in its time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stamps: list[float] = []

    def tick(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())

    def intervals(self, warmup: int) -> list[float]:
        """Step times after the first `warmup` steps (interval i = end of step i - end of step i-1)."""
        return [b - a for a, b in zip(self.stamps[warmup:], self.stamps[warmup + 1 :])]


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def random_batches(p: Preset, n: int, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    vocab = vocab_size_of(p.tokenizer)
    return [torch.randint(0, vocab, (p.batch, p.seq_len + 1), generator=g).to(device) for _ in range(n)]


def fmt_rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def fmt_bytes(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def optim_config(steps: int) -> OptimConfig:
    # The quickstart's optimiser; a schedule of exactly the measured length.
    return OptimConfig(lr=2e-3, weight_decay=0.1, warmup_steps=max(1, steps // 10), decay_steps=steps)


def compile_blocks(model: GPT) -> None:
    """Regional compilation of every block, with dynamo's caches emptied first: every variant's blocks run the same
    code object (`Block.forward`), whose graphs count towards one recompile limit (8) per process, so without the reset
    the variants after the first few would silently run eager. A limit hit is an error, not an eager fallback."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    for block in model.blocks:
        block.compile()


# --------------------------------------------------------------------------------------------------------- framework
def bench_framework(p: Preset, args, device, dtype) -> tuple[list[Row], float]:
    """Lightning vs a plain loop, interleaved over `args.rounds` rounds. Returns rows and Lightning's tokens/s."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader

    from lightning_cqk.module import LitLM

    steps = args.warmup + args.steps
    cfg = p.config()
    windows = torch.cat(random_batches(p, steps, torch.device("cpu"), seed=1))  # (steps * B, T + 1), on the host

    def loader() -> DataLoader:
        # The same host DataLoader for both (pinned and copied by each side as it would in training).
        return DataLoader(windows, batch_size=p.batch, shuffle=False, drop_last=True, pin_memory=device.type == "cuda")

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.clock = Clock(device)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.clock.tick()

    precision = {torch.float32: "32-true", torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}[dtype]
    torch.manual_seed(0)
    lit = LitLM(cfg, optim_config(steps), compile=args.compile)
    torch.manual_seed(0)
    plain = LitLM(cfg, optim_config(steps)).to(device)  # only for its model and the identical optimiser recipe
    if args.compile:
        compile_blocks(plain.model)
    light_times: list[float] = []
    stack_times: list[float] = []
    plain_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-lightning-") as tmp:
        for _ in range(args.rounds):
            for shipped, times in ((False, light_times), (True, stack_times)):
                clock_cb = StepClock()
                # The shipped stack (configs/quickstart.yaml's callbacks, checkpoints into the temporary folder).
                extra = shipped_callbacks(Path(tmp) / "ckpt") if shipped else []
                trainer = L.Trainer(
                    accelerator=device.type,
                    devices=1,
                    precision=precision,
                    max_steps=steps,
                    logger=TensorBoardLogger(tmp, name="bench", default_hp_metric=False),
                    callbacks=[clock_cb, *extra],
                    enable_checkpointing=shipped,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    limit_val_batches=0,
                    num_sanity_val_steps=0,
                    log_every_n_steps=10,
                    gradient_clip_val=1.0,
                    default_root_dir=tmp,
                )
                trainer.fit(lit, train_dataloaders=loader())
                times += clock_cb.clock.intervals(args.warmup)

            model = plain.model
            opt_cfg = plain.configure_optimizers()
            optimizer, scheduler = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
            clock = Clock(device)
            model.train()
            for batch in loader():
                batch = batch.to(device, non_blocking=True)
                x, y = batch[:, :-1], batch[:, 1:]  # (B, T) each
                with autocast(device, dtype):
                    logits = model(x)  # (B, T, vocab)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                clock.tick()
            plain_times += clock.intervals(args.warmup)
    t_light, t_plain = statistics.median(light_times), statistics.median(plain_times)
    tps_light, tps_plain = p.tokens / t_light, p.tokens / t_plain
    row = Row(
        p.label,
        "Lightning step vs plain loop, tokens/s",
        f"{fmt_rate(tps_light)} ({t_light * 1e3:.1f} ms)",
        f"{fmt_rate(tps_plain)} ({t_plain * 1e3:.1f} ms)",
        tps_light / tps_plain,
        ("framework", "lightning"),
    )
    t_stack = statistics.median(stack_times)
    stack_row = Row(
        p.label,
        "Lightning + shipped callbacks vs plain loop, tokens/s",
        f"{fmt_rate(p.tokens / t_stack)} ({t_stack * 1e3:.1f} ms)",
        f"{fmt_rate(tps_plain)} ({t_plain * 1e3:.1f} ms)",
        t_plain / t_stack,
        ("framework", "callbacks"),
    )
    return [row, stack_row], tps_light


def shipped_callbacks(ckpt_dir: Path) -> list:
    """The callbacks of configs/quickstart.yaml, built from their class paths (checkpoints under `ckpt_dir`)."""
    import importlib

    import yaml

    listed = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())["trainer"]["callbacks"]
    built = []
    for spec in listed:
        module, name = spec["class_path"].rsplit(".", 1)
        kwargs = dict(spec.get("init_args") or {})
        if name in ("RunCheckpoint", "BestCheckpoint"):
            kwargs["dirpath"] = str(ckpt_dir)
        built.append(getattr(importlib.import_module(module), name)(**kwargs))
    return built


# ---------------------------------------------------------------------------------------------------------- backends
def parse_value(text: str):
    """An option value from the command line: JSON (numbers, true, null, ...) or else the bare string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def backend_variants(names: list[str] | None) -> dict[str, tuple[str, dict]]:
    labels = names or [*attention.available(), *VARIANTS]
    labels = [b for label in labels for b in ([BASES[label], label] if label in BASES else [label])]  # bases too
    out: dict[str, tuple[str, dict]] = {"standard": ("standard", {})}
    for label in labels:
        if label in VARIANTS or label in INFERENCE_VARIANTS:
            out[label] = VARIANTS.get(label) or INFERENCE_VARIANTS[label]
        elif "=" in label:  # name:opt=value,opt=value, e.g. coupled:steps=2
            name, _, opts = label.partition(":")
            out[label] = (name, {k: parse_value(v) for k, v in (o.split("=", 1) for o in opts.split(","))})
        else:
            attention.get_attention(label)  # clear error for unknown names
            out[label] = (label, {})
    return out


def step_fn(model: GPT, optimizer: torch.optim.Optimizer, device, dtype):
    def step(batch: torch.Tensor, marker=None) -> None:
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T) each
        with marker("forward") if marker else contextlib.nullcontext():
            with autocast(device, dtype):
                logits = model(x)  # (B, T, vocab)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        if marker:
            marker.forward_done()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


class CudaMemory:
    """Activation (alive after forward) and peak bytes above the resting state, from the CUDA allocator."""

    def __init__(self) -> None:
        self.start = self.after_forward = 0

    @contextlib.contextmanager
    def __call__(self, name: str):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start = torch.cuda.memory_allocated()
        yield

    def forward_done(self) -> None:
        self.after_forward = torch.cuda.memory_allocated() - self.start

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() - self.start


def cpu_memory(step, batch) -> tuple[int, int]:
    """(bytes alive after the forward, peak bytes) of one step, from torch.profiler's CPU allocation events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    class Marker:
        def __call__(self, name):
            return record_function("bench_forward")

        def forward_done(self):
            pass

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(batch, Marker())
    allocations: list[tuple[int, int]] = []
    forward_end = [None]

    def walk(nodes) -> None:
        for node in nodes:
            if node.tag == _EventType.Allocation:
                allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
            elif node.name == "bench_forward":
                forward_end[0] = node.end_time_ns
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    allocations.sort()
    live = peak = 0
    after_forward = None
    for t, size in allocations:
        if after_forward is None and t > forward_end[0]:
            after_forward = live
        live += size
        peak = max(peak, live)
    return (live if after_forward is None else after_forward), peak


def print_profile(title: str, step, batch: torch.Tensor, device: torch.device, rows: int) -> None:
    """torch.profiler table of one step's top operators by self time (after the timed steps, so warm)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\nprofile of one step: {title}\n{prof.key_averages().table(sort_by=sort, row_limit=rows)}", flush=True)


def analytic_parameters(cfg) -> int:
    """The model's parameter count, built on the meta device (no memory)."""
    with torch.device("meta"):
        return GPT(cfg).num_parameters()["total"]


def resident_groups(labels: list[str], state_bytes: dict[str, float], budget: float | None) -> list[list[str]]:
    """The variants whose models stay resident together: all of them (timed round-robin, step by step side by side)
    when their weights, gradients and AdamW states fit in `budget` bytes, else one at a time (each built, timed and
    freed in turn; `standard` first, so every ratio still has its reference in the same run)."""
    if budget is None or sum(state_bytes.values()) <= budget:
        return [labels]
    return [[label] for label in labels]


def bench_backends(p: Preset, args, device, dtype) -> list[Row]:
    variants = backend_variants(args.backends)
    configs, errors = {}, {}
    for label, (name, options) in variants.items():
        try:
            configs[label] = p.config(name, options)
        except Exception as err:  # noqa: BLE001 - reported in the table, the others still run
            errors[label] = f"{type(err).__name__}: {err}"
    state = {label: 16.0 * analytic_parameters(cfg) for label, cfg in configs.items()}  # fp32 weights, grads, AdamW
    budget = 0.5 * torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    batch = random_batches(p, 1, device, seed=2)[0]
    times: dict[str, list[float]] = {label: [] for label in configs}
    memory: dict[str, tuple[int, int]] = {}
    for group in resident_groups(list(configs), state, budget):
        steps = {}
        for label in group:
            try:
                torch.manual_seed(0)
                model = GPT(configs[label]).to(device)
                if args.compile:
                    compile_blocks(model)
                fused = device.type == "cuda" or None
                optimizer = torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=1e-4, fused=fused)
                steps[label] = step_fn(model, optimizer, device, dtype)
            except Exception as err:  # noqa: BLE001 - reported in the table, the others still run
                errors[label] = f"{type(err).__name__}: {err}"
        for rep in range(args.warmup + args.steps):
            for label, step in list(steps.items()):
                clock = Clock(device)
                clock.tick()
                try:
                    step(batch)
                except Exception as err:  # noqa: BLE001
                    errors[label] = f"{type(err).__name__}: {err}"
                    del steps[label]
                    continue
                clock.tick()
                if rep >= args.warmup:
                    times[label].append(clock.stamps[1] - clock.stamps[0])
        for label, step in steps.items():
            if device.type == "cuda":
                marker = CudaMemory()
                step(batch, marker)
                memory[label] = (marker.after_forward, marker.peak())
            else:
                memory[label] = cpu_memory(step, batch)
        for label in args.profile or []:
            if label in steps:
                print_profile(f"{p.label}, {label}", steps[label], batch, device, args.profile_rows)
        del steps  # the group's models and optimizers (the closures hold them) go before the next group's
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "standard" not in memory:
        return [Row(p.label, f"{label}: step", f"error: {err[:120]}") for label, err in errors.items()]
    peak_flops = device_peak_flops(device, dtype) if device.type == "cuda" else args.peak_flops
    rows: list[Row] = []
    t0 = statistics.median(times["standard"])
    a0, m0 = memory["standard"]
    for label in variants:
        if label in errors:
            rows.append(Row(p.label, f"{label}: step", f"error: {errors[label][:120]}"))
            continue
        t = statistics.median(times[label])
        act, peak = memory[label]
        flops = training_flops_per_batch(configs[label], p.batch, p.seq_len)
        mfu = f"{flops / t / peak_flops * 100:.1f}%" if peak_flops else "-"
        base = BASES.get(label)
        if base in times and times[base]:  # a composition: against its own base mechanism, step by step
            tb = statistics.median(times[base])
            (ab, mb), what = memory[base], f"{label}: step time vs {base}"
        else:
            (tb, ab, mb), what = (t0, a0, m0), f"{label}: step time"
        rows.append(Row(p.label, what, f"{t * 1e3:.1f} ms", f"{tb * 1e3:.1f} ms", t / tb, ("time", label), mfu))
        rows.append(Row(p.label, f"{label}: activations", fmt_bytes(act), fmt_bytes(ab), act / ab, ("act", label)))
        rows.append(Row(p.label, f"{label}: peak memory", fmt_bytes(peak), fmt_bytes(mb), peak / mb, ("peak", label)))
    return rows


# --------------------------------------------------------------------------------------------------------- inference
def bench_inference(p: Preset, args, device, dtype) -> list[Row]:
    """KV cache bytes, prefill and decode speed, decode memory of every backend vs standard (bench_inference.py)."""
    from bench_inference import fmt_size, measure_inference, median

    variants = backend_variants(args.backends)
    if args.backends is None:
        variants.update(INFERENCE_VARIANTS)
    block = max(p.seq_len + args.decode_steps, args.decode_tokens + 1)
    configs, errors = {}, {}
    for label, (name, options) in variants.items():
        try:
            configs[label] = dataclasses.replace(p.config(name, options), block_size=block)
        except Exception as err:  # noqa: BLE001
            errors[label] = f"{type(err).__name__}: {err}"
    results = measure_inference(
        configs, p.batch, p.seq_len, args.decode_steps, args.decode_tokens, args.rounds, device, dtype
    )
    results.update(errors)
    std = results.get("standard")
    if isinstance(std, str):
        return [Row(p.label, "standard: inference", f"error: {std[:120]}")]
    n_head = configs["standard"].n_head
    paper = {"k_eq_v": (0.5, "0.5x"), "q_mqa": (1 / (2 * n_head), f"1/(2 n_head) = {1 / (2 * n_head):.4g}x")}
    rows: list[Row] = []
    pre0, dec0 = p.tokens / median(std.prefill_times), p.batch / median(std.decode_times)
    for label in variants:
        r = results[label]
        if isinstance(r, str):
            rows.append(Row(p.label, f"{label}: inference", f"error: {r[:120]}"))
            continue
        ratio = r.cache_bytes_per_token / std.cache_bytes_per_token if std.cache_bytes_per_token else None
        ok = r.cache_bytes_per_token == r.analytic_bytes_per_token
        want = f"= analytic {r.analytic_bytes_per_token:,.0f} B"
        if label in paper and ratio is not None:
            ok = ok and abs(ratio - paper[label][0]) < 1e-12
            want += f", {paper[label][1]}"
        fixed = f" + {r.fixed_bytes:,} B/row fixed" if r.fixed_bytes else ""
        rows.append(
            Row(
                p.label,
                f"{label}: KV cache bytes/token",
                f"{r.cache_bytes_per_token:,.0f} B{fixed}",
                f"{std.cache_bytes_per_token:,.0f} B",
                ratio,
                exact=(want, ok),
            )
        )
        pre, dec = p.tokens / median(r.prefill_times), p.batch / median(r.decode_times)
        what = f"{label}: prefill tokens/s ({p.seq_len}-token prompts)"
        rows.append(Row(p.label, what, fmt_rate(pre), fmt_rate(pre0), pre / pre0))
        rows.append(Row(p.label, f"{label}: decode tokens/s", fmt_rate(dec), fmt_rate(dec0), dec / dec0))
        rows.append(
            Row(
                p.label,
                f"{label}: peak memory, decoding {args.decode_tokens:,} tokens",
                fmt_size(r.peak_bytes),
                fmt_size(std.peak_bytes),
                r.peak_bytes / std.peak_bytes if std.peak_bytes else None,
            )
        )
    ref, gen = p.batch / median(std.reference_times), p.batch / median(std.generate_times)
    what = "standard: generate_reference (no cache, full forward per token) vs generate (KV cache), tokens/s"
    rows.append(Row(p.label, what, fmt_rate(ref), fmt_rate(gen), ref / gen))
    return rows


# ------------------------------------------------------------------------------------------------------ data, prepare
def gather_text(source: str, path: Path) -> int:
    """Write the documents of `source` to a JSON-lines file (so prepare is timed without gathering); its bytes."""
    from lightning_cqk.data.sources import iter_documents

    n = 0
    with path.open("w", encoding="utf-8") as f:
        for doc in iter_documents(source):
            f.write(json.dumps({"text": doc.text}) + "\n")
            n += len(doc.text.encode("utf-8"))
    return n


def gpt2_unavailable(bpe_file: str | None) -> str | None:
    """None when the GPT-2 vocabulary can be loaded here, else one line saying what the gpt2 rows need."""
    from lightning_cqk.data.tokenizers import get_tokenizer
    from lightning_cqk.errors import UserError

    try:
        get_tokenizer("gpt2", bpe_file)
    except UserError as err:
        why = str(err).split(" (", 1)[0].split(". ", 1)[0]
        return (
            f"they need the GPT-2 vocabulary ({why}): give --bpe_file /path/to/gpt2.tiktoken (or set "
            "LIGHTNING_CQK_GPT2_BPE, or put ../shared/data/gpt2_bpe/gpt2.tiktoken beside the repository)"
        )
    return None


def bench_prepare(args, workdir: Path, tokenizers: set[str]) -> tuple[list[Row], dict[str, Path]]:
    """Prepare shards for every tokenizer the presets use (timing gpt2's); returns rows and the shard folders."""
    from lightning_cqk.data.prepare import prepare

    progress(f"prepare from {args.prepare_source}")
    text = workdir / "corpus.jsonl"
    n_bytes = gather_text(args.prepare_source, text)
    shards: dict[str, Path] = {}
    rows: list[Row] = []
    timed = getattr(args, "prepare_tokenizer", "gpt2") if "prepare" in args.only else None
    for tokenizer in sorted(tokenizers | ({timed} if timed else set())):
        rates = []
        reps = args.prepare_rounds if tokenizer == timed else 1
        for r in range(reps):
            out = workdir / f"shards-{tokenizer}-{r}"
            with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
                t0 = time.perf_counter()
                prepare(str(text), str(out), tokenizer=tokenizer, bpe_file=args.bpe_file, num_workers=1)
                rates.append(n_bytes / 1e6 / (time.perf_counter() - t0))
            shards[tokenizer] = out
        if tokenizer == timed:
            rate = statistics.median(rates)
            rows.append(
                Row(
                    f"{args.prepare_source} ({n_bytes / 1e6:.2f} MB)",
                    "prepare with gpt2, MB/s of text per worker",
                    f"{rate:.2f} MB/s",
                    ratio=rate,
                    key=("prepare", "gpt2"),
                )
            )
    return rows, shards


def bench_loader(p: Preset, args, shards: Path, consumption: float | None) -> list[Row]:
    """Tokens/s of the real training DataLoader over `shards`, vs the training step's consumption."""
    from lightning_cqk.data import TokenDataModule

    dm = TokenDataModule(
        data_dir=str(shards),
        source=None,
        tokenizer=p.tokenizer,
        bpe_file=args.bpe_file,
        seq_len=p.seq_len,
        batch_size=p.batch,
        num_workers=args.loader_workers,
    )
    dm.setup("fit")
    rates = []
    for _ in range(args.rounds):
        it = iter(dm.train_dataloader())
        for _ in range(2):  # warm-up: worker start, first chunk
            next(it)
        n, t0 = 0, time.perf_counter()
        for batch in it:
            n += batch[:, :-1].numel()
            if time.perf_counter() - t0 > args.loader_seconds:
                break
        rates.append(n / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    if consumption is None:
        return [Row(p.label, "loader tokens/s", fmt_rate(rate))]
    return [
        Row(
            p.label,
            f"loader ({args.loader_workers} workers) vs training step, tokens/s",
            fmt_rate(rate),
            fmt_rate(consumption),
            rate / consumption,
            ("loader", "loader"),
        )
    ]


# -------------------------------------------------------------------------------------------------------------- main
def print_table(rows: list[Row], header: str) -> None:
    lines = [header, ""]
    cols = ["preset", "measure", "value", "reference (standard / plain)", "ratio", "target", "", "MFU"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        target, verdict = r.verdict()
        ratio = "-" if r.ratio is None else (f"{r.ratio:.2f}" if r.key and r.key[0] == "prepare" else f"{r.ratio:.2f}x")
        if r.key and r.key[0] == "prepare":
            ratio = "-"
        lines.append(
            f"| {r.preset} | {r.measure} | {r.value} | {r.reference} | {ratio} | {target} | {verdict} | {r.mfu} |"
        )
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16", "fp16"), help="auto: bf16 on CUDA")
    parser.add_argument(
        "--presets",
        nargs="+",
        default=None,
        help="preset:tokenizer:BxT (default CPU: tiny:bytes:16x256 tiny:gpt2:4x256; CUDA: 60m:gpt2:16x1024 "
        "150m:gpt2:8x1024)",
    )
    parser.add_argument("--backends", nargs="*", default=None, help="labels (default: all + k_eq_v); name:opt=v,...")
    parser.add_argument("--only", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--steps", type=int, default=8, help="measured steps per repetition")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--rounds", type=int, default=3, help="Lightning/plain alternations; loader passes")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="regional torch.compile of every block")
    parser.add_argument("--profile", nargs="*", default=None, help="backend labels to profile (top-ops table)")
    parser.add_argument("--profile_rows", type=int, default=15)
    parser.add_argument("--peak_flops", type=float, default=None, help="peak FLOP/s for MFU (CPU, unknown GPUs)")
    for field_name in ("n_layer", "n_embd", "n_head", "mlp_hidden"):
        parser.add_argument(f"--{field_name}", type=int, default=None, help="override the preset's model shape")
    parser.add_argument("--prepare_source", default="builtin:python_docs")
    parser.add_argument("--prepare_rounds", type=int, default=3)
    parser.add_argument("--bpe_file", default=None, help="GPT-2 .tiktoken (default $LIGHTNING_CQK_GPT2_BPE)")
    parser.add_argument("--loader_workers", type=int, default=0, help="DataLoader workers (quickstart: 0)")
    parser.add_argument("--loader_seconds", type=float, default=1.0, help="seconds per loader pass")
    parser.add_argument("--decode_steps", type=int, default=32, help="inference: timed decode steps per round")
    parser.add_argument("--decode_tokens", type=int, default=1024, help="inference: tokens decoded for peak memory")
    args = parser.parse_args(argv)
    SHAPE_OVERRIDES.clear()
    SHAPE_OVERRIDES.update(
        {k: getattr(args, k) for k in ("n_layer", "n_embd", "n_head", "mlp_hidden") if getattr(args, k) is not None}
    )

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    if args.bpe_file is None and not os.environ.get("LIGHTNING_CQK_GPT2_BPE"):
        shared = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpt2_bpe" / "gpt2.tiktoken"
        if shared.is_file():
            args.bpe_file = str(shared)
    # Only prepare and loader tokenize text; the other rows draw random ids below the vocabulary size, so the GPT-2
    # vocabulary file matters only to those two.
    missing_gpt2 = gpt2_unavailable(args.bpe_file) if {"prepare", "loader"} & set(args.only) else None
    if missing_gpt2 and any(":gpt2:" in f":{s}:" for s in args.presets or []):
        sys.exit(f"bench: {missing_gpt2}")
    if missing_gpt2 and set(args.only) == {"prepare"}:  # its one row times the GPT-2 tokenizer: nothing to show
        reason = missing_gpt2.replace("they need", "which needs", 1)
        sys.exit(f"bench: nothing to measure: --only prepare times the GPT-2 tokenizer, {reason}")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype_name = args.dtype if args.dtype != "auto" else ("bf16" if cuda else "fp32")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    specs = args.presets or (
        ["60m:gpt2:16x1024", "150m:gpt2:8x1024"] if cuda else ["tiny:bytes:16x256", "tiny:gpt2:4x256"]
    )
    note = ""
    if missing_gpt2:  # the default presets, without the GPT-2 vocabulary: bytes only, said in one line
        specs = [s for s in specs if ":gpt2:" not in s] or [s.replace(":gpt2:", ":bytes:") for s in specs]
        args.prepare_tokenizer = None
        note = f"; gpt2 rows skipped: {missing_gpt2}"
        print(f"bench: gpt2 rows skipped: {missing_gpt2}", file=sys.stderr, flush=True)
    presets = [Preset.parse(s) for s in specs]

    load0 = os.getloadavg()
    start = time.perf_counter()
    rows: list[Row] = []
    consumption: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        shards: dict[str, Path] = {}
        if "prepare" in args.only or "loader" in args.only:
            tokenizers = {p.tokenizer for p in presets} if "loader" in args.only else set()
            prep_rows, shards = bench_prepare(args, Path(tmp), tokenizers)
            rows += prep_rows
        for p in presets:
            if "framework" in args.only:
                progress(f"{p.label}: Lightning vs plain loop, {args.rounds} rounds")
                framework_rows, consumption[p.label] = bench_framework(p, args, device, dtype)
                rows += framework_rows
            if "loader" in args.only:
                progress(f"{p.label}: loader")
                rows += bench_loader(p, args, shards[p.tokenizer], consumption.get(p.label))
            if "backends" in args.only:
                progress(f"{p.label}: backends")
                rows += bench_backends(p, args, device, dtype)
            if "inference" in args.only:
                progress(f"{p.label}: inference")
                rows += bench_inference(p, args, device, dtype)
    load1 = os.getloadavg()
    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    header = (
        f"lightning_cqk bench: {name}, {dtype_name}{', compiled blocks' if args.compile else ''}; torch "
        f"{torch.__version__}; median of {args.steps} steps x {args.rounds if 'framework' in args.only else 1} "
        f"after {args.warmup} warm-up; load average {load0[0]:.2f} {load0[1]:.2f} at start, {load1[0]:.2f} "
        f"{load1[1]:.2f} at end ({os.cpu_count()} cores); {time.perf_counter() - start:.0f} s{note}"
    )
    print_table(rows, header)


if __name__ == "__main__":
    main()
