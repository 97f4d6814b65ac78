"""The inference rows of `make bench` (benchmarks/bench.py, section `inference`): KV cache, prefill, decode, memory.

For every backend variant, with random weights in the inference dtype (the model itself is cast: fp32 on CPU, bf16
on CUDA by default, so the cache has the element size a deployment would use):

    cache bytes/token   `DecodeCache.nbytes_per_token()` of a real cache (its time-axis buffers' bytes / max_len,
                        summed over layers), against the analytic count: the sum over layers of the backend's
                        `kv_cache_values_per_token` x element size. Both must agree exactly. A fixed per-row state
                        (`fixed_nbytes`, e.g. a recurrent state) is reported beside it.
    prefill tokens/s    B x T prompt tokens / (new_cache + one forward over them), median over rounds.
    decode tokens/s     B / the median time of one decode forward (one new token per row, greedy argmax included),
                        decoding `decode_steps` tokens after that prompt.
    decode peak memory  peak bytes allocated above the resting state (weights) while a fresh cache decodes
                        `decode_tokens` tokens (1,024 by default) after a 1-token prompt per row: the cache plus the
                        transient activations of one step. CUDA: `max_memory_allocated`; CPU: the allocation events
                        of `torch.profiler` (profile_memory), whose running sum is what torch holds.
    cache-free decode   (standard only) tokens/s of `lightning_cqk.inference.generate_reference` (a full forward over
                        the whole context per token) against `generate` (the KV cache), greedy, the same
                        min(decode_steps, 8) tokens after the same prompt: the user-facing paths, sampling included.

Variants take turns in every round (interleaved), so machine load hits them alike; figures are medians.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field

import torch

from lightning_cqk.inference import generate
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

#: Variants of the inference rows besides the training bench's (label -> backend name and options), whose caches
#: the papers compare: Q-MQA caches one K head (= V), 1 / (2 n_head) of standard (arXiv 2606.04032); MQA one K and
#: one V head. (`k_eq_v`, Q-K=V, K only: 50% of standard, is one of the training bench's variants.) By default they
#: run in the inference section only; `--backends q_mqa` names them explicitly (then the training rows have them too).
INFERENCE_VARIANTS: dict[str, tuple[str, dict]] = {
    "q_mqa": ("standard", {"qkv_sharing": "k_eq_v", "n_kv_groups": 1}),
    "mqa": ("standard", {"n_kv_groups": 1}),
}


@dataclass
class InferenceResult:
    """One variant's measurements (times in seconds, sizes in bytes)."""

    cache_bytes_per_token: float
    analytic_bytes_per_token: float
    fixed_bytes: int
    prefill_times: list[float] = field(default_factory=list)
    decode_times: list[float] = field(default_factory=list)
    generate_times: list[float] = field(default_factory=list)
    reference_times: list[float] = field(default_factory=list)
    peak_bytes: int = 0


def analytic_bytes_per_token(model: GPT, dtype: torch.dtype) -> float:
    """Sum over layers of `kv_cache_values_per_token(config, options)` x the element size of `dtype`."""
    size = torch.empty((), dtype=dtype).element_size()
    values = sum(type(b.attn).kv_cache_values_per_token(model.config, b.attn.options) for b in model.blocks)
    return float(values * size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def _timed_decode(model: GPT, prompt: torch.Tensor, steps: int, device: torch.device, result: InferenceResult) -> None:
    """Prefill `prompt` (B, T) into a fresh cache, then `steps` greedy decode forwards; appends their times."""
    V = model.config.vocab_size
    _sync(device)
    t0 = time.perf_counter()
    cache = model.new_cache(prompt.size(0), prompt.size(1) + steps)
    logits = model(prompt, cache=cache)  # (B, T, padded vocab)
    _sync(device)
    result.prefill_times.append(time.perf_counter() - t0)
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = logits[:, -1, :V].argmax(-1, keepdim=True)  # (B, 1)
        logits = model(tok, cache=cache)  # (B, 1, padded vocab)
        _sync(device)
        result.decode_times.append(time.perf_counter() - t0)


def _timed_generate(model: GPT, prompt: torch.Tensor, steps: int, device: torch.device, use_cache: bool) -> list[float]:
    """Seconds per token of `generate` (greedy; cached) or `generate_reference` (a full forward per token), for
    `steps` tokens after the prompt: the time between consecutive yields, the first (the prefill) left out."""
    prompts = prompt.tolist()
    times, t0 = [], None
    for step in generate(model, prompts, steps + 1, temperature=0, use_cache=use_cache):
        _sync(device)
        t = time.perf_counter()
        if t0 is not None:
            times.append(t - t0)
        t0 = t
        del step
    return times


class _Decoder:
    """A fresh cache decoding greedily from a 1-token prompt per row, a given number of steps at a time."""

    def __init__(self, model: GPT, batch: int, tokens: int, device: torch.device) -> None:
        self.model, self.batch, self.tokens, self.device = model, batch, tokens, device
        self.cache = self.tok = None

    @torch.inference_mode()
    def run(self, steps: int) -> None:
        """`steps` forwards; the first one builds the cache (the resting state is before it)."""
        V = self.model.config.vocab_size
        for _ in range(steps):
            if self.cache is None:
                self.cache = self.model.new_cache(self.batch, self.tokens + 1)
                self.tok = torch.zeros(self.batch, 1, dtype=torch.long, device=self.device)  # (B, 1)
            self.tok = self.model(self.tok, cache=self.cache)[:, -1, :V].argmax(-1, keepdim=True)  # (B, 1)


def _profiled(fn) -> tuple[int, int]:
    """(peak, net) of the running sum of the CPU allocation events (frees are negative) while `fn` runs: exact for
    what is allocated after it starts, and about 2.5x slower per decode step than without the profiler."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    del prof, stack
    gc.collect()  # the profiler's results sit in reference cycles: without a collection they pile up chunk on chunk
    return peak, live


#: Decode steps per profiled chunk on CPU: the profiler keeps every event of its window in host memory (a window of
#: 1,025 steps of a tiny `differential` took more than 12 GB, and the OOM killer ended `make bench` on a 24 GB
#: machine); chunks, each collected before the next, keep it under 1 GB, and their running sums chain exactly.
PROFILE_CHUNK = 64


def peak_decode_bytes(model: GPT, batch: int, tokens: int, device: torch.device) -> int:
    """Peak bytes allocated above the resting state while decoding `tokens` tokens into a fresh cache (CUDA: the
    allocator's peak; CPU: the running sum of torch.profiler's allocation events over the whole decode, profiled in
    chunks of `PROFILE_CHUNK` steps: each chunk's peak counts from what the earlier chunks left allocated)."""
    decoder = _Decoder(model, batch, tokens, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        decoder.run(tokens + 1)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    live = peak = 0
    for start in range(0, tokens + 1, PROFILE_CHUNK):
        steps = min(PROFILE_CHUNK, tokens + 1 - start)
        chunk_peak, chunk_net = _profiled(lambda steps=steps: decoder.run(steps))
        peak, live = max(peak, live + chunk_peak), live + chunk_net
    return peak


def measure_inference(
    configs: dict[str, ModelConfig],
    batch: int,
    prompt_len: int,
    decode_steps: int,
    decode_tokens: int,
    rounds: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, InferenceResult | str]:
    """Every variant's `InferenceResult` (or the error that stopped it, as text), measured in interleaved rounds
    (the first round is a warm-up and not kept)."""
    models: dict[str, GPT] = {}
    results: dict[str, InferenceResult | str] = {}
    for label, cfg in configs.items():
        try:
            torch.manual_seed(0)
            model = GPT(cfg).to(device=device, dtype=dtype).eval()
            cache = model.new_cache(batch, prompt_len + decode_steps)
            results[label] = InferenceResult(
                cache.nbytes_per_token(), analytic_bytes_per_token(model, dtype), cache.fixed_nbytes()
            )
            del cache
            models[label] = model
        except Exception as err:  # noqa: BLE001 - reported in the table, the others still run
            results[label] = f"{type(err).__name__}: {err}"
    vocab = min(cfg.vocab_size for cfg in configs.values())
    prompt = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
    for rnd in range(rounds + 1):
        for label, model in list(models.items()):
            result = results[label]
            try:
                if rnd == 0:  # warm-up round, not kept
                    _timed_decode(model, prompt, decode_steps, device, InferenceResult(0, 0, 0))
                else:
                    _timed_decode(model, prompt, decode_steps, device, result)
                if label == "standard":  # a full forward per token is slow: a few tokens are enough
                    cached = _timed_generate(model, prompt, min(decode_steps, 8), device, use_cache=True)
                    free = _timed_generate(model, prompt, min(decode_steps, 8), device, use_cache=False)
                    if rnd > 0:
                        result.generate_times += cached
                        result.reference_times += free
            except Exception as err:  # noqa: BLE001
                results[label] = f"{type(err).__name__}: {err}"
                del models[label]
    for label, model in models.items():
        try:
            results[label].peak_bytes = peak_decode_bytes(model, batch, decode_tokens, device)
        except Exception as err:  # noqa: BLE001
            results[label] = f"{type(err).__name__}: {err}"
    return results


def fmt_size(n: float) -> str:
    """Bytes in KiB below a MiB, else MiB (the decode memory of small models is a few KiB)."""
    return f"{n / 2**10:.1f} KiB" if abs(n) < 2**20 else f"{n / 2**20:.1f} MiB"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
