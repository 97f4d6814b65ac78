"""One run under every launcher (issue 24 item 1): `torchrun` and `srun` give one run directory, one plan, and after a
SIGTERM and a resume the same weights on every rank.

The commands are the ones in docs/scaling-out.md (the single-node torchrun line, the sbatch script's srun line), run
on CPU with gloo and 2 processes. `srun` is simulated: the test starts the 2 tasks itself with the variables srun
sets (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_NNODES, SLURM_JOB_ID,
SLURM_STEP_ID, SLURM_NODELIST, ...), sends SIGTERM to both (what scancel and a preemption do) and resumes as the
requeued job (same job id, SLURM_RESTART_COUNT=1). Before the fix, srun's tasks each planned and locked a run of
their own, and torchrun's rank 1 resumed from no checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_run import child_env, quickstart_callbacks, tiny_args

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
DOC = REPO / "docs" / "scaling-out.md"
STOP_AT, MAX_STEPS = 3, 5

pytestmark = pytest.mark.slow


def doc_command(starts: str) -> list[str]:
    """The one command line in docs/scaling-out.md's code blocks that begins with `starts` (continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    found = [line.split("#")[0].strip() for line in lines if line.startswith(starts)]
    assert len(found) == 1, f"docs/scaling-out.md should hold exactly one `{starts} ...` command, found {found}"
    return shlex.split(found[0])


def expand(args: list[str], variables: dict[str, str]) -> list[str]:
    return [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], a) for a in args]


def overrides(shards: Path, runs: Path, out: Path, stop_at: int | None) -> list[str]:
    """The tiny run after the documented command (its --config is the quickstart's), with the probe callback beside
    the quickstart's stack; the run folder last (`finish` reads it)."""
    probe = {"class_path": "launch_probe.LaunchProbe", "init_args": {"out": str(out), "stop_at": stop_at}}
    cb = quickstart_callbacks(out.parent / f"{out.name}-callbacks.yaml", probe, every_n_steps=2, keep_last=2)
    return tiny_args(
        shards,
        runs,
        "--model.optim.warmup_steps=2",
        f"--trainer.max_steps={MAX_STEPS}",
        "--trainer.val_check_interval=1000",
        "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
        configs=[cb],
        quickstart=False,
    )


def base_env() -> dict[str, str]:
    return child_env(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, procs: list[subprocess.Popen], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            outs = [p.communicate(timeout=60) for p in procs]
            raise AssertionError(f"no {path.name}: {[o[1][-3000:] for o in outs]}")
        time.sleep(0.1)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        out.append((p.returncode, err))
        Path(p.args[-1].split("=", 1)[-1]).parent.joinpath(f"stderr-{p.pid}.txt").write_text(err)  # for a failure
    return out


def check_one_run(runs: Path, outs: list[Path]) -> None:
    """One run directory, two attempts (interrupted at STOP_AT, then finished), and the same weights on both ranks."""
    dirs = [d for d in (runs / "quickstart").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(dirs) == 1, f"one launch must be one run, got {[d.name for d in dirs]}"
    record = json.loads((dirs[0] / "run.json").read_text())
    attempts = [(a["status"], a.get("from_step"), a.get("step")) for a in record["attempts"]]
    assert attempts == [("interrupted", 0, STOP_AT), ("finished", STOP_AT, MAX_STEPS)], attempts
    assert not list((runs / "quickstart" / ".launches").glob("*.json")), "rank 0 removes its plan file at exit"
    starts = [json.loads(p.read_text()) for p in outs[1].glob("start-*.json")]
    assert sorted((s["rank"], s["step"], s["world"]) for s in starts) == [(0, STOP_AT, 2), (1, STOP_AT, 2)]
    assert {s["log_dir"] for s in starts} == {str(dirs[0])}
    r0, r1 = (torch.load(outs[1] / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["step"] == r1["step"] == MAX_STEPS
    for name, value in r0["weights"].items():
        assert torch.equal(value, r1["weights"][name]), f"{name} differs between ranks after the resume"


def test_torchrun_line_of_the_docs_is_one_run_that_stops_and_resumes_alike_on_every_rank(tiny_shards, tmp_path):
    runs, outs = tmp_path / "runs", [tmp_path / "attempt1", tmp_path / "attempt2"]
    command = expand(
        doc_command("torchrun --standalone"), {"NPROC": "2", "CONFIG": str(REPO / "configs/quickstart.yaml")}
    )
    assert command[0] == "torchrun"
    launcher = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    first = subprocess.Popen(
        [*launcher, *overrides(tiny_shards, runs, outs[0], STOP_AT)],
        env=base_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(outs[0] / "stop-requested", [first])
    first.send_signal(signal.SIGTERM)  # torchrun passes it on to every worker
    ((code, err),) = finish([first])
    assert "interrupted by SIGTERM at step 3" in err, err[-4000:]
    second = subprocess.run(
        [*launcher, *overrides(tiny_shards, runs, outs[1], None)],
        env=base_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-4000:]
    check_one_run(runs, outs)


def srun(args: list[str], job: dict[str, str], restart: int) -> list[subprocess.Popen]:
    """Two tasks on one node, as `srun` starts them (the variables Lightning's SLURMEnvironment reads, and more)."""
    procs = []
    for rank in range(2):
        env = dict(base_env(), **job)
        env.update(SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_RESTART_COUNT=str(restart))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "lightning_cqk", *args[1:]],
                env=env,
                cwd=job["SLURM_SUBMIT_DIR"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return procs


def test_srun_line_of_the_sbatch_script_is_one_run_that_stops_and_resumes_alike_on_every_rank(tiny_shards, tmp_path):
    runs, outs = tmp_path / "runs", [tmp_path / "attempt1", tmp_path / "attempt2"]
    job = {
        "SLURM_JOB_ID": "424242",
        "SLURM_JOB_NAME": "train.sbatch",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "MASTER_PORT": str(free_port()),
    }
    command = expand(doc_command("srun "), {**job, "CONFIG": str(REPO / "configs/quickstart.yaml")})
    assert command[:3] == ["srun", "lightning_cqk", "fit"]
    first = srun([*command[1:], *overrides(tiny_shards, runs, outs[0], STOP_AT)], job, restart=0)
    wait_for(outs[0] / "stop-requested", first)
    for proc in first:
        proc.send_signal(signal.SIGTERM)  # scancel / preemption: every task
    (code0, err0), (code1, err1) = finish(first)
    assert (code0, code1) == (143, 143), (err0[-3000:], err1[-3000:])
    assert "interrupted by SIGTERM at step 3" in err0, err0[-4000:]
    job["MASTER_PORT"] = str(free_port())
    second = srun([*command[1:], *overrides(tiny_shards, runs, outs[1], None)], job, restart=1)  # the requeued job
    results = finish(second)
    assert [code for code, _ in results] == [0, 0], [err[-3000:] for _, err in results]
    check_one_run(runs, outs)


def test_sigusr1_saves_into_the_run_requeues_and_a_stray_hpc_checkpoint_is_never_restored(tiny_shards, tmp_path):
    """Issue 34, defect 2. The sbatch script's `--signal=SIGUSR1@90` stops both tasks at one step, saves into the
    run's own checkpoints/ (never `hpc_ckpt_N.ckpt` in the working directory), requeues the job once (a stand-in
    `scontrol` records the call) and the requeued job resumes that run. Then a different run (another seed) launched
    from the same folder under SLURM, with a stray `hpc_ckpt_1.ckpt` there (another run's state at its last step),
    starts at step 0 and names the file: before the fix Lightning restored it and the new run reported the old one's
    result as its own."""
    runs, outs = tmp_path / "runs", [tmp_path / "attempt1", tmp_path / "attempt2", tmp_path / "other"]
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    job = {
        "SLURM_JOB_ID": "515151", "SLURM_JOB_NAME": "train.sbatch", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost", "SLURM_SUBMIT_DIR": str(tmp_path),
        "MASTER_PORT": str(free_port()), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }  # fmt: skip
    command = expand(doc_command("srun "), {**job, "CONFIG": str(REPO / "configs/quickstart.yaml")})
    first = srun([*command[1:], *overrides(tiny_shards, runs, outs[0], STOP_AT)], job, restart=0)
    wait_for(outs[0] / "stop-requested", first)
    for proc in first:
        proc.send_signal(signal.SIGUSR1)  # SLURM's warning, 90 s before the time limit: every task
    (code0, err0), (code1, err1) = finish(first)
    assert (code0, code1) == (138, 143), (err0[-3000:], err1[-3000:])
    assert "interrupted by SIGUSR1 at step 3" in err0, err0[-4000:]
    assert "SLURM job 515151 requeued" in err0, err0[-4000:]
    assert calls.read_text().split("\n")[:-1] == ["requeue 515151"], "rank zero requeues once, after saving"
    assert not list(tmp_path.rglob("hpc_ckpt_*")), "Lightning's auto-requeue wrote its own checkpoint"
    job["MASTER_PORT"] = str(free_port())
    results = finish(srun([*command[1:], *overrides(tiny_shards, runs, outs[1], None)], job, restart=1))
    assert [code for code, _ in results] == [0, 0], [err[-3000:] for _, err in results]
    check_one_run(runs, outs)

    (run_dir,) = [d for d in (runs / "quickstart").iterdir() if d.is_dir() and not d.name.startswith(".")]
    stray = tmp_path / "hpc_ckpt_1.ckpt"
    stray.write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())  # step 5 of that run
    job.update(SLURM_JOB_ID="525252", MASTER_PORT=str(free_port()))
    other = [*command[1:], "--seed_everything=7", *overrides(tiny_shards, runs, outs[2], None)]  # save_dir stays last
    results = finish(srun(other, job, restart=0))
    assert [code for code, _ in results] == [0, 0], [err[-3000:] for _, err in results]
    assert f"note: {stray}: checkpoint(s) of Lightning's SLURM auto-requeue" in results[0][1], results[0][1][-3000:]
    starts = [json.loads(p.read_text()) for p in outs[2].glob("start-*.json")]
    assert sorted((s["rank"], s["step"]) for s in starts) == [(0, 0), (1, 0)], "the new run restored the stray file"
    new_run = runs / "quickstart" / run_dir.name.replace("-s1337", "-s7")
    attempts = json.loads((new_run / "run.json").read_text())["attempts"]
    assert [(a["status"], a["from_step"], a["step"]) for a in attempts] == [("finished", 0, MAX_STEPS)]
    assert stray.exists(), "a file the run does not own is left alone"
