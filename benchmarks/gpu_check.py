"""One prepared GPU check (issue 32): prepare here, run there, read one table.

    make gpu-check-prep     # on a machine with the package index: the wheels the GPU image lacks -> .devcheck/
    make gpu-check          # on the GPU machine, the work tree copied with .devcheck/ (about 8 minutes)
    python benchmarks/gpu_check.py --dry-run --budget 300   # the same stages on a CPU, tiny shapes (the plumbing)

Prep (`--prep`) downloads, with `pip download`, the locked versions (requirements.lock) of the packages the GPU
image does not hold (`CARRIED`: litdata and jsonargparse and what they need; lightning at the locked version) as
Python 3.12 manylinux wheels into `.devcheck/wheels` (git ignores `.devcheck/`), and copies the GPT-2 vocabulary file
when one is at hand (`--bpe_file`, $LIGHTNING_CQK_GPT2_BPE, ../shared/data/gpt2_bpe/gpt2.tiktoken).

The check installs those wheels into a private folder (`pip install --no-index --target`, put first on PYTHONPATH
with the repository) and runs its stages in order, each a subprocess under its own time limit inside one budget
(`--budget`, default 480 s):

    env          the device, torch/CUDA/cuDNN versions, the packages the check imports, a bf16 matmul's TFLOP/s
    gpu_suite    `pytest -m gpu tests/gpu` (every backend trains in bf16 eager and compiled, the sync probe, ...)
    bench        benchmarks/bench.py --only backends at 60m, 16 x 1024, bf16: step time, activations, MFU per backend
    kernels      which SDPA kernel each backend's bf16 step runs (flash / cuDNN / efficient / math), and why not flash
    memory       peak memory of 3 training steps per backend (torch.cuda.max_memory_allocated) against the analytic
                 estimate `lightning_cqk fit` checks before a run (memory_check.estimate)
    smoke        FSDP2 (--trainer.strategy ModelParallelStrategy) with activation checkpointing, the chunked loss and
                 meta-device init, through the command line for 20 steps, then
                 --ckpt_path last to 30: the resume must continue at step 20

A stage that fails or times out is recorded and the next one runs; a stage that would not fit in the budget left is
skipped and the table names the command that runs it alone (`--stages NAME`). The table (stage, status, seconds,
result) is printed and written to `summary.md`, each stage's output to `<stage>.log`, in $OUT when set (the device
tool's folder that comes back), else `gpu_check_out/`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVCHECK = REPO / ".devcheck"
#: Packages the GPU image lacks (or holds at another version), at requirements.lock's versions for Python 3.12.
CARRIED = ("lightning", "litdata", "obstore", "jsonargparse", "docstring-parser", "typeshed-client", "boto3",
           "botocore", "s3transfer", "jmespath")  # fmt: skip
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


# ------------------------------------------------------------------------------------------------------------ prep
def locked_pins(lock: Path, names: tuple[str, ...] = CARRIED, python: str = DEVICE_PYTHON) -> list[str]:
    """`name==version` of each package in `names`, the lock line whose environment marker holds for `python`."""
    from packaging.markers import Marker

    environment = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64",
                   "implementation_name": "cpython"}  # fmt: skip
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if "==" not in requirement:
            continue
        pin, _, marker = requirement.partition(";")
        name = pin.split("==")[0].strip().lower()
        if name in names and (not marker.strip() or Marker(marker.strip()).evaluate(environment)):
            found[name] = pin.strip()
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"gpu_check --prep: {lock} pins no version of {', '.join(missing)} for Python {python}.")
    return [found[n] for n in names]


def prep_command(pins: list[str], dest: Path) -> list[str]:
    """The `pip download` of Python 3.12 x86-64 wheels of `pins` (no dependencies: each one is named) into `dest`."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", DEVICE_PYTHON, "--implementation", "cp", *platforms, "--platform", "any", "-d",
            str(dest), *pins]  # fmt: skip


def prep(bpe_file: str | None) -> None:
    wheels = DEVCHECK / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    subprocess.run(prep_command(locked_pins(REPO / "requirements.lock"), wheels), check=True)
    for candidate in (bpe_file, os.environ.get("LIGHTNING_CQK_GPT2_BPE"),
                      REPO.parent / "shared" / "data" / "gpt2_bpe" / "gpt2.tiktoken"):  # fmt: skip
        if candidate and Path(candidate).is_file():
            shutil.copy(candidate, DEVCHECK / "gpt2.tiktoken")
            break
    size = sum(p.stat().st_size for p in DEVCHECK.rglob("*") if p.is_file()) / 1e6
    print(f"gpu_check --prep: {len(list(wheels.glob('*.whl')))} wheels, {size:.1f} MB in {DEVCHECK}. On the GPU "
          "machine, with .devcheck copied along: make gpu-check")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------- stages
@dataclass(frozen=True)
class Stage:
    """One stage: its command, its own time limit and the least time worth starting it with."""

    name: str
    command: list[str]
    limit_s: int
    min_s: int
    result: Callable[[str], str] = lambda log: ""  # one line of what the stage found, read from its log


@dataclass
class Outcome:
    name: str
    status: str  # ok / FAIL(rc=N) / TIMEOUT / SKIPPED
    seconds: float
    result: str


def run_stages(
    stages: list[Stage], budget_s: float, out: Path, env: dict[str, str], reserve_s: float = 15
) -> list[Outcome]:
    """Run each stage under min(its limit, the budget left); go on past a failure; skip what no longer fits."""
    start = time.monotonic()
    outcomes = []
    for stage in stages:
        left = budget_s - (time.monotonic() - start) - reserve_s
        if left < stage.min_s:
            rerun = f"python benchmarks/gpu_check.py --stages {stage.name}"
            outcomes.append(Outcome(stage.name, "SKIPPED", 0.0, f"{left:.0f} s of the budget left, needs {stage.min_s}"
                                    f" s: run it alone with `{rerun}`"))  # fmt: skip
            continue
        limit = min(stage.limit_s, left)
        log = out / f"{stage.name}.log"
        print(f"gpu_check: [{stage.name}] limit {limit:.0f} s: {' '.join(stage.command)[:200]}", flush=True)
        began = time.monotonic()
        with log.open("w") as sink:
            try:
                done = subprocess.run(stage.command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                      timeout=limit, start_new_session=True)  # fmt: skip
                status = "ok" if done.returncode == 0 else f"FAIL(rc={done.returncode})"
            except subprocess.TimeoutExpired:
                status = "TIMEOUT"
        text = log.read_text(errors="replace")
        try:
            found = stage.result(text)
        except Exception as err:  # noqa: BLE001 - a result that cannot be read is said, the table still comes
            found = f"(result unreadable: {type(err).__name__}: {err})"
        if status != "ok" and not found:
            found = " / ".join(text.strip().splitlines()[-2:])[-300:]
        outcomes.append(Outcome(stage.name, status, time.monotonic() - began, found))
        print(f"gpu_check: [{stage.name}] {status} in {outcomes[-1].seconds:.0f} s {found[:200]}", flush=True)
    return outcomes


def summary_table(outcomes: list[Outcome], title: str) -> str:
    lines = [f"# gpu_check: {title}", "", "| stage | status | seconds | result |", "|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.result.replace('|', '/')[:700]} |")
    return "\n".join(lines) + "\n"


def _last_json(log: str) -> dict:
    lines = [line for line in log.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _pytest_result(log: str) -> str:
    tail = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    failed = re.findall(r"^FAILED (\S+)", log, re.M)
    return (tail[-1].strip("= ") if tail else "") + (f"; failed: {', '.join(failed)[:300]}" if failed else "")


def _bench_result(log: str) -> str:
    rows = re.findall(r"^\| [^|]+ \| (\S+): step time \| ([^|]+) \|[^|]*\| ([^|]*) \|[^|]*\|[^|]*\| ([^|]*) \|$", log,
                      re.M)  # fmt: skip
    parts = [f"{name} {value.strip()} ({ratio.strip() or '1.00x'} standard, MFU {mfu.strip()})"
             for name, value, ratio, mfu in rows]  # fmt: skip
    return "; ".join(parts)


def stages_for(dry_run: bool, bpe: str | None) -> list[Stage]:
    py = sys.executable
    me = [py, str(Path(__file__).resolve())]
    dry = ["--dry-run"] if dry_run else []
    preset = "tiny:bytes:2x32" if dry_run else f"60m:{'gpt2' if bpe else 'bytes'}:16x1024"
    bench_device = ["--device", "cpu", "--threads", "1", "--backends", "standard", "coupled"] if dry_run else [
        "--device", "cuda"]  # fmt: skip
    return [
        Stage("env", [*me, "--probe", "env", *dry], 60, 10, lambda log: _last_json(log).get("summary", "")),
        Stage(
            "gpu_suite",
            [py, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider", "-rfE", "--timeout", "240"],
            240,
            60,
            _pytest_result,
        ),  # fmt: skip
        Stage(
            "bench",
            [
                py,
                "benchmarks/bench.py",
                *bench_device,
                "--only",
                "backends",
                "--presets",
                preset,
                "--steps",
                "5",
                "--warmup",
                "2",
            ],
            150,
            40,
            _bench_result,
        ),  # fmt: skip
        Stage("kernels", [*me, "--probe", "kernels", *dry], 60, 20, lambda log: _last_json(log).get("summary", "")),
        Stage("memory", [*me, "--probe", "memory", *dry], 90, 30, lambda log: _last_json(log).get("summary", "")),
        Stage("smoke", [*me, "--probe", "smoke", *dry], 150, 60, lambda log: _last_json(log).get("summary", "")),
    ]


# ----------------------------------------------------------------------------------------------------------- probes
PROBE_BACKENDS = {
    "standard": ("standard", {}), "gqa": ("standard", {"n_kv_groups": 4}), "qk_norm": ("standard", {"qk_norm": True}),
    "coupled": ("coupled", {}), "invertible": ("standard", {"qk_transform": {"kind": "invertible"}}),
    "differential": ("differential", {}), "mla": ("mla", {}), "static_emb_qk": ("static_emb_qk", {}),
    "rnd_emb_qk": ("rnd_emb_qk", {}),
}  # fmt: skip


def _probe_config(name: str, dry_run: bool):
    from lightning_cqk.model_config import ModelConfig

    attention, options = PROBE_BACKENDS[name]
    if dry_run:
        return ModelConfig(preset="tiny", n_layer=2, block_size=64, vocab_size=257, attention=attention,
                           attention_options=options)  # fmt: skip
    return ModelConfig(preset="60m", block_size=1024, vocab_size=50257, vocab_multiple=64, attention=attention,
                       attention_options=options)  # fmt: skip


def probe_env(dry_run: bool) -> dict:
    import importlib

    import torch

    found = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("lightning", "litdata", "jsonargparse", "torchmetrics", "tiktoken", "lightning_cqk"):
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as err:  # noqa: BLE001
            found[name] = f"MISSING ({type(err).__name__})"
    device = "cpu (dry run)"
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
        found.update(cudnn=torch.backends.cudnn.version(), capability=list(torch.cuda.get_device_capability(0)))
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        found["bf16_matmul_tflops"] = round(10 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12)
    missing = [k for k, v in found.items() if str(v).startswith("MISSING")]
    found["summary"] = (f"{device}; torch {found['torch']} (CUDA {found['cuda']}); lightning {found['lightning']}"
                        + (f"; bf16 matmul {found['bf16_matmul_tflops']} TFLOP/s" if "bf16_matmul_tflops" in found
                           else "") + (f"; MISSING: {', '.join(missing)}" if missing else ""))  # fmt: skip
    return found


SDPA_KERNELS = {"flash": "flash_attention", "cudnn": "cudnn_attention", "efficient": "efficient_attention",
                "math": "_scaled_dot_product_attention_math"}  # fmt: skip


def _flash_refusal(q, k, v, mask, is_causal: bool, enable_gqa: bool) -> str:
    """Why the flash kernel would not take these inputs (torch's own checks, their warnings), '' when it would."""
    import warnings

    import torch

    if not torch.cuda.is_available() or q.device.type != "cuda":
        return "not CUDA"
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
    q, k, v = (t.detach().to(dtype) for t in (q, k, v))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, is_causal, enable_gqa)
            ok = torch.backends.cuda.can_use_flash_attention(params, True)
        except Exception as err:  # noqa: BLE001 - another torch's signature: say so rather than guess
            return f"unknown ({type(err).__name__}: {err})"[:200]
    return "" if ok else "; ".join(str(w.message)[:160] for w in caught[:2]) or "refused (no reason given)"


def probe_kernels(dry_run: bool) -> dict:
    """Which SDPA kernel each backend's bf16 forward + backward runs (the profiler's op names), what it hands SDPA
    (dtype, a stride-0 batch, a mask, GQA) and, on CUDA, why the flash kernel would not take it."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import profile

    from lightning_cqk.model import GPT

    device = "cuda" if torch.cuda.is_available() and not dry_run else "cpu"
    original = F.scaled_dot_product_attention
    calls: list[dict] = []

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kwargs):
        if not calls:
            calls.append({"dtype": str(q.dtype).replace("torch.", ""), "head_size": q.size(-1),
                          "stride0_batch": any(t.stride(0) == 0 and t.size(0) > 1 for t in (q, k, v)),
                          "mask": attn_mask is not None, "gqa": bool(enable_gqa),
                          "flash_refused": _flash_refusal(q, k, v, attn_mask, is_causal, enable_gqa)})  # fmt: skip
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa, **kwargs)  # fmt: skip

    found: dict[str, dict] = {}
    F.scaled_dot_product_attention = recording
    try:
        for name in PROBE_BACKENDS:
            calls.clear()
            torch.manual_seed(0)
            model = GPT(_probe_config(name, dry_run)).to(device)
            idx = torch.randint(0, 257, (2, 64), device=device)
            with profile() as prof, torch.autocast(device, torch.bfloat16):
                model(idx).float().mean().backward()
            ops = {event.key for event in prof.key_averages()}
            kernels = sorted({k for k, needle in SDPA_KERNELS.items() if any(needle in op for op in ops)})
            found[name] = {"kernels": kernels or ["none (no SDPA call)"], **(calls[0] if calls else {})}
    finally:
        F.scaled_dot_product_attention = original
    by_kernel: dict[str, list[str]] = {}
    for name, row in found.items():
        by_kernel.setdefault("+".join(row["kernels"]), []).append(name)
    found["summary"] = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(by_kernel.items()))
    return found


def probe_memory(dry_run: bool) -> dict:
    """Peak memory of 3 AdamW steps under bf16 autocast against `memory_check.estimate` (16 x 1024 at 60m)."""
    import torch

    from lightning_cqk.model import GPT
    from lightning_cqk.run.memory_check import estimate

    cuda = torch.cuda.is_available() and not dry_run
    batch, seq = (2, 64) if dry_run else (16, 1024)
    found: dict[str, dict] = {}
    for name in ("standard", "coupled", "differential", "mla"):
        config = _probe_config(name, dry_run)
        torch.manual_seed(0)
        model = GPT(config).to("cuda" if cuda else "cpu")
        n_params = sum(p.numel() for p in model.parameters())
        analytic = estimate(n_params, config.n_layer, config.n_embd, config.mlp_hidden, config.padded_vocab_size,
                            batch, seq, "bf16-mixed", gated=config.ffn == "swiglu").total  # fmt: skip
        row = {"analytic_GB": round(analytic / 1e9, 2)}
        if cuda:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            torch.cuda.reset_peak_memory_stats()
            for _ in range(3):
                idx = torch.randint(0, config.vocab_size, (batch, seq + 1), device="cuda")
                with torch.autocast("cuda", torch.bfloat16):
                    logits = model(idx[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            row["measured_GB"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
            row["measured_over_analytic"] = round(row["measured_GB"] / row["analytic_GB"], 3)
            del model, optimizer
            torch.cuda.empty_cache()
        found[name] = row
    what = "measured / analytic" if cuda else "analytic only (no CUDA: the dry run measures nothing)"
    found["summary"] = f"{what}: " + "; ".join(
        f"{n} {r.get('measured_GB', '-')} / {r['analytic_GB']} GB" for n, r in found.items()
    )
    return found


def probe_smoke(dry_run: bool) -> dict:
    """FSDP2 through the command line, 20 steps, then `--ckpt_path last` to 30: it must continue at step 20."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gpu-check-smoke-"))
    with (root / "corpus.jsonl").open("w") as f:
        for i in range(120):
            f.write(json.dumps({"text": f"Doc {i}. " + "Queries meet keys in the attention. " * (3 + i % 4)}) + "\n")
    device = ["--trainer.accelerator=cpu", "--trainer.precision=32-true"] if dry_run else [
        "--trainer.accelerator=cuda", "--trainer.precision=bf16-mixed"]  # fmt: skip
    shape = ["--model.config.n_layer=2", "--model.config.n_embd=64", "--model.config.n_head=2"] if dry_run else []
    base = [sys.executable, "-m", "lightning_cqk", "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
            f"--data.source={root / 'corpus.jsonl'}", f"--data.data_dir={root / 'shards'}", "--data.seq_len=64",
            "--data.batch_size=8", "--data.val_fraction=0.2", "--trainer.val_check_interval=10",
            "--trainer.limit_val_batches=2",
            "--trainer.strategy", "ModelParallelStrategy", "--trainer.devices=1", *device, *shape,
            "--model.activation_checkpointing=true", "--model.loss_chunk=256", "--model.meta_init=true",
            "--model.optim.warmup_steps=2",
            f"--trainer.logger.init_args.save_dir={root / 'runs'}"]  # fmt: skip
    found: dict = {}
    for steps, extra in ((20, []), (30, ["--ckpt_path", "last"])):
        done = subprocess.run([*base, f"--trainer.max_steps={steps}", *extra], capture_output=True, text=True,
                              cwd=root, timeout=600)  # fmt: skip
        print(done.stdout[-2000:], done.stderr[-3000:], sep="\n", flush=True)
        found[f"fit_to_{steps}_rc"] = done.returncode
        if done.returncode:
            break
    records = list((root / "runs").rglob("run.json"))
    attempts = json.loads(records[0].read_text())["attempts"] if len(records) == 1 else []
    found["attempts"] = [(a.get("status"), a.get("from_step"), a.get("step")) for a in attempts]
    resumed = [a[1:] for a in found["attempts"]] == [(0, 20), (20, 30)]
    found["summary"] = (
        "FSDP2 fit 20 steps, resumed at step 20 to 30"
        if resumed
        else f"NOT resumed as it should: "
        f"{found['attempts']} (return codes {[v for k, v in found.items() if k.endswith('_rc')]})"
    )
    found["ok"] = resumed
    return found


PROBES = {"env": probe_env, "kernels": probe_kernels, "memory": probe_memory, "smoke": probe_smoke}


# ------------------------------------------------------------------------------------------------------------- main
def install_wheels(env: dict[str, str]) -> str:
    """Install .devcheck/wheels into a private folder put first on PYTHONPATH (with the repository); what it did."""
    wheels = sorted((DEVCHECK / "wheels").glob("*.whl"))
    paths = [str(REPO)]
    note = "no .devcheck/wheels (run `make gpu-check-prep` where pip reaches the index): the image's packages only"
    if wheels:
        site = Path(env.get("TMPDIR", "/tmp")) / "gpu-check-site"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), *map(str, wheels)], check=True)  # fmt: skip
        paths.insert(0, str(site))
        note = f"{len(wheels)} wheels from .devcheck/wheels installed into {site}"
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prep", action="store_true", help="download the wheels the GPU image lacks into .devcheck/")
    parser.add_argument("--bpe_file", default=None, help="GPT-2 .tiktoken to copy into .devcheck/ (--prep)")
    parser.add_argument("--dry-run", action="store_true", help="the stages on a CPU with tiny shapes (the plumbing)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET", 480)))
    parser.add_argument("--stages", nargs="+", default=None, help="a subset, in the table's order")
    parser.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)  # one stage's own process
    args = parser.parse_args(argv)
    if args.prep:
        prep(args.bpe_file)
        return 0
    if args.probe:
        found = PROBES[args.probe](args.dry_run)
        print(json.dumps(found, default=str))
        return 0 if found.get("ok", True) else 1
    out = Path(os.environ.get("OUT") or REPO / "gpu_check_out")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", LITDATA_DISABLE_VERSION_CHECK="1", HF_HUB_OFFLINE="1",
               LIGHTNING_CQK_UNLOCKED="1")  # fmt: skip
    installed = install_wheels(env)
    bpe = next((str(p) for p in (DEVCHECK / "gpt2.tiktoken",) if p.is_file()), None)
    if bpe:
        env["LIGHTNING_CQK_GPT2_BPE"] = bpe
    if args.dry_run:
        env["OMP_NUM_THREADS"] = "1"
    stages = stages_for(args.dry_run, bpe)
    if args.stages:
        unknown = sorted(set(args.stages) - {s.name for s in stages})
        if unknown:
            parser.error(f"unknown stage(s) {', '.join(unknown)}; the stages: {', '.join(s.name for s in stages)}")
        stages = [s for s in stages if s.name in args.stages]
    print(f"gpu_check: {installed}; budget {args.budget:.0f} s; output in {out}", flush=True)
    outcomes = run_stages(stages, args.budget, out, env)
    title = ("dry run on a CPU (plumbing only: no GPU number)" if args.dry_run else "GPU check") + f", {installed}"
    table = summary_table(outcomes, title)
    (out / "summary.md").write_text(table)
    print("\n" + table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
