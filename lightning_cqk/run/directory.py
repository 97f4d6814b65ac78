"""One owner for run directories: how a run is named, locked, recorded and resumed.

Every command that trains into `runs/<experiment>/<run>/` goes through this module: `lightning_cqk fit`
(cli/trainer.py), the downstream CLI and `lightning_cqk glue` (cli/glue.py, cli/glue_command.py), the sweep runner
(study/run/runner.py) and the callbacks that write beside the logs (callbacks/common.py `run_dir`). It is also the one
answer to "which run does this checkpoint belong to" (`checkpoint_run`: `<run>/checkpoints/<file>` of a directory
with a run record; `fit --ckpt_path` resumes into it, `validate` logs beside it, `glue` fine-tunes under it) and the
package's one JSON writer (`write_json_atomically`: run.json, budgets, summaries, manifests, sweep status, results).
Standard library only at import.

Naming. A run is `{attention}-{size}-s{seed}` (`config.size_label`: the preset plus any shape field set against
it, e.g. `60m-L6`); a new run never writes into an earlier run's directory: it gets the
first free `-2`, `-3`, ... suffix (`next_free_name`). A directory that holds nothing but an unheld lock (a launch that
died before it wrote anything) counts as free and is reused. `fit` removes a directory it created itself when the
launch fails before training starts (a typo in a path, a refused resume), so no empty directory is left to be
mistaken for a run later.

Locking. `run/lock.py`: one live process per directory, by an OS file lock held for the process's life.

Records. `run.json` lists the run's attempts: when each started (pid, host, command, the checkpoint and step it
resumed from, the settings it changed, the code it ran (`revision`: the git commit, `-dirty` with uncommitted
changes) and the versions of Python and of every direct dependency it ran with: `packages`, run/version_records.py)
and how it ended (`finished`, `interrupted` by SIGTERM/SIGINT with a saved checkpoint, `failed` with the error); an
attempt still `running` whose process is gone was killed (SIGKILL, power loss). The resolved configuration of the
first attempt is `config.yaml`; every resume adds `config.resume-<n>.yaml`, so each earlier configuration is kept.
Nothing is recorded before training has really started: a refused resume leaves the directory as it was.

Resuming (`resolve_fit`), what "run the same command again" does:
    --ckpt_path last    resume the newest run of this name that has a checkpoint (a newer directory without one,
                        e.g. a launch killed before its first save, is passed over and named); none: start afresh.
    --ckpt_path FILE    resume from FILE; when FILE lies in `<run>/checkpoints/`, into that run's directory.
    no --ckpt_path      the newest run of this name is unfinished (stopped by a signal, killed, crashed) and has a
                        checkpoint: `--on_unfinished resume` (default) resumes it when the settings are the same as
                        its last attempt's, and refuses with the exact commands otherwise; `new` starts a new run
                        beside it; `refuse` always refuses with both commands. A finished run, a live one or one
                        without a checkpoint: a new run beside it, and the message says why.
In every case the checkpoint is the intact one of the highest step: `checkpoints/last.ckpt` when it reads back intact
and no intact `step=*.ckpt` beside it holds a later step (a kill between a periodic write and the link that points
last.ckpt at it); when last.ckpt is missing, a dangling link or damaged, the newest intact `step=*.ckpt` by step (and
the message says so); with none, the run is refused by name rather than restarted from step 0.

Which settings a resume may change (`classify_changes`): the optimizer's hyper-parameters (lr, betas, eps,
weight_decay, warmup_steps, min_lr_ratio, decay_steps, fused: applied to the restored optimizer and schedule by
`RunSession`), trainer settings (max_steps, validation and logging cadence, clipping, precision, devices,
callbacks), the budget, dropout, compilation and evaluation contexts. Everything else (the architecture, tokenizer,
data, seed, logit control) is refused: a resumed run must be the same experiment.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_cqk.checkpoint.reading import checkpoint_problem, checkpoint_step, same_checkpoint, step_in_name
from lightning_cqk.environment import env_text
from lightning_cqk.errors import ConfigError
from lightning_cqk.files.atomic import write_json_atomically
from lightning_cqk.run.lock import (
    LOCK_NAME,
    RunDirectoryInUse,
    acquire,
    holder,
    process_start,
)
from lightning_cqk.run.version_records import code_revision, package_versions

__all__ = [
    "RunDirectoryInUse",
    "ResumeRefused",
    "acquire",
    "holder",
    "resolve_fit",
    "resumable_checkpoint",
    "classify_changes",
]

RECORD_NAME = "run.json"
# A sweep's run: the identity the sweep computed for it (lightning_cqk/study/run/identity.py), recorded in each attempt.
RUN_IDENTITY_ENV = "LIGHTNING_CQK_RUN_IDENTITY"
CONFIG_NAME = "config.yaml"
RUNNING, FINISHED, INTERRUPTED, FAILED = "running", "finished", "interrupted", "failed"
ON_UNFINISHED = ("resume", "new", "refuse")


class ResumeRefused(ValueError):
    """A resume (or a new run) that would mix two experiments or lose a checkpoint; the message says what to do."""


class UnsafeRunName(ConfigError):
    """A logger name or version that is not one plain directory name (`..`, `/`): the run would leave save_dir."""


_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]")
_HIDDEN_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")  # controls, format characters (bidi, zero-width), separators
MAX_NAME_BYTES = 200  # a directory name holds 255 bytes on most file systems; room for a -N suffix and .lock/.json


def _hidden_character(text: str) -> str | None:
    """The first character of `text` that is invisible or changes how the text around it is displayed (a right-to-left
    override U+202E, a zero-width space, ...), described as `U+XXXX NAME at position N`; None when there is none."""
    for i, char in enumerate(text):
        if unicodedata.category(char) in _HIDDEN_CATEGORIES:
            name = unicodedata.name(char, "a control character")
            return f"U+{ord(char):04X} {name} at position {i + 1}"
    return None


def _without_hidden(text: str) -> str:
    return "".join(c for c in text if unicodedata.category(c) not in _HIDDEN_CATEGORIES)


def _shortened(text: str) -> str:
    """`text` cut to MAX_NAME_BYTES bytes of UTF-8 (never inside a character)."""
    return text.encode("utf-8")[:MAX_NAME_BYTES].decode("utf-8", errors="ignore")


def check_run_name_part(value: Any, flag: str) -> None:
    """Refuse a run directory name part (the logger's `name` or `version`) that is not one plain directory name.

    `..`, `.`, a path separator or a control character would put the run directory, and the clean-up of a failed
    launch, outside `save_dir` (issue 25 class 7); a name longer than MAX_NAME_BYTES bytes would fail at the first
    mkdir with `OSError: File name too long`; an invisible or text-direction character (U+202E right-to-left override
    and the other bidi controls, zero-width characters) makes the name display as another one (issue 34). Checked
    before anything is created. None and "" pass (defaults).
    """
    if value is None or value == "":
        return
    text = str(value)
    if text in (".", "..") or _UNSAFE.search(text) or (os.altsep and os.altsep in text):
        safe = _UNSAFE.sub("-", text).replace("..", "-").strip(".-") or "run"
        raise UnsafeRunName(
            f"{flag} {text!r} is not a plain directory name (it is '.' or '..', or holds a path separator or a control "
            "character), so the run directory, and the clean-up of a launch that fails, would leave save_dir. Give "
            f"one name, e.g. {flag} {shlex.quote(safe)}; to write elsewhere, set --trainer.logger.init_args.save_dir."
        )
    hidden = _hidden_character(text)
    if hidden is not None:
        safe = _without_hidden(text).strip(".-") or "run"
        raise UnsafeRunName(
            f"{flag} {text!r} holds an invisible or text-direction character ({hidden}): the run directory's name "
            f"would display as another name than it is (in ls, logs and reports). Give a name without it, e.g. {flag} "
            f"{shlex.quote(_shortened(safe))}"
        )
    size = len(text.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise UnsafeRunName(
            f"{flag} is {len(text)} characters ({size} bytes of UTF-8) long: a directory name holds at most 255 bytes "
            f"on most file systems, and the run's name also gets a -N suffix, so the limit here is {MAX_NAME_BYTES} "
            f"bytes. Give a shorter name, e.g. {flag} {shlex.quote(_shortened(text))}"
        )


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------- naming
def _run_of_path(checkpoint: Any) -> Path | None:
    """`<run>` of a path `<run>/checkpoints/<file>` (by its shape alone), else None."""
    path = Path(str(checkpoint))
    return path.parent.parent if path.parent.name == "checkpoints" and path.parent.parent.name else None


def checkpoint_run(checkpoint: Any) -> Path | None:
    """The run directory a checkpoint belongs to, or None: the one answer every command uses.

    A checkpoint belongs to `<run>` when it is `<run>/checkpoints/<file>` and `<run>` holds a run's record
    (`run.json`, or the `config.yaml` of a run older than run.json). `fit --ckpt_path FILE` resumes into that run,
    `validate`/`test`/`predict` log beside its curves, `glue` logs its fine-tuning runs under `<run>/glue/`.
    """
    run = _run_of_path(checkpoint) if checkpoint else None
    if run is None:
        return None
    return run if (run / RECORD_NAME).is_file() or (run / CONFIG_NAME).is_file() else None


def checkpoint_run_name(checkpoint: str | Path) -> str:
    """A short name for a checkpoint: its run's name, else the file's stem.

    Also for a path recorded earlier (a glue.json's checkpoint) whose run is gone or elsewhere now: the name comes
    from the path's shape (`<run>/checkpoints/<file>`), as `checkpoint_run` reads it.
    """
    run = _run_of_path(checkpoint)
    return run.name if run is not None else Path(checkpoint).stem


def base_run_name(attention: Any, size: Any, seed: Any) -> str:
    """The run name of a language-model run: `{attention}-{size}-s{seed}`.

    `size` is the preset, plus any shape field set against it (`config.size_label`: `60m`, `60m-L6`). A backend named
    by its `package.module:Class` path is written with a dot for the colon (`mylab.sigattn.SigmoidAttention`): a
    colon in a directory name breaks TensorBoard's `name:path` logdir syntax and Windows paths.
    """
    return f"{str(attention).replace(':', '.')}-{size}-s{seed}"


def numbered_dirs(root: Path, base: str) -> list[Path]:
    """The existing directories `base`, `base-2`, `base-3`, ... under `root`, in suffix order."""
    if not root.is_dir():
        return []
    pattern = re.compile(rf"^{re.escape(base)}(?:-(\d+))?$")
    found = []
    for child in root.iterdir():
        match = pattern.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1) or 1), child))
    return [p for _, p in sorted(found)]


def is_husk(run_dir: Path) -> bool:
    """A directory left by a launch that died before writing anything: at most an unheld lock file."""
    if not run_dir.is_dir():
        return False
    names = {p.name for p in run_dir.iterdir()}
    return names <= {LOCK_NAME} and holder(run_dir) is None


def next_free_name(root: Path, base: str) -> str:
    """`base`, else the first free `base-N` (a husk counts as free)."""
    for i in range(1, 100000):
        name = base if i == 1 else f"{base}-{i}"
        if not (root / name).exists() or is_husk(root / name):
            return name
    raise RuntimeError(f"No free run name {base}-N under {root}.")


# -------------------------------------------------------------------------------------------------- records
def read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None


def config_files(run_dir: Path) -> list[Path]:
    """The resolved configurations of the run's attempts, oldest first: config.yaml, config.resume-1.yaml, ..."""
    run_dir = Path(run_dir)
    files = [run_dir / CONFIG_NAME] if (run_dir / CONFIG_NAME).is_file() else []
    resumes = []
    for p in run_dir.glob("config.resume-*.yaml"):
        match = re.fullmatch(r"config\.resume-(\d+)\.yaml", p.name)
        if match:
            resumes.append((int(match.group(1)), p))
    return files + [p for _, p in sorted(resumes)]


def next_config_name(run_dir: Path) -> str:
    files = config_files(run_dir)
    if not files:
        return CONFIG_NAME
    last = files[-1].name
    n = int(last.split("-")[1].split(".")[0]) if last != CONFIG_NAME else 0
    return f"config.resume-{n + 1}.yaml"


@dataclass
class RunState:
    """What a run directory holds, as `resolve_fit` needs it."""

    path: Path
    status: str  # "finished", "unfinished", "running" (live), "legacy" (no run.json), "empty"
    checkpoint: Path | None  # the checkpoint a resume would use
    note: str = ""  # why that checkpoint and not last.ckpt, or why there is none
    step: int | None = None  # the last recorded step
    live: Any = None  # the LockOwner of a live holder


def run_state(run_dir: Path) -> RunState:
    run_dir = Path(run_dir)
    live = holder(run_dir)
    ckpt, note = resumable_checkpoint(run_dir)
    record = read_record(run_dir)
    if live is not None:
        return RunState(run_dir, "running", ckpt, note, live=live)
    if record is None or not record.get("attempts"):
        status = "empty" if is_husk(run_dir) else "legacy"
        return RunState(run_dir, status, ckpt, note)
    last = record["attempts"][-1]
    status = "finished" if last.get("status") == FINISHED else "unfinished"
    return RunState(run_dir, status, ckpt, note, step=last.get("step"))


def describe_end(run_dir: Path) -> str:
    """How the last attempt of a run ended, in words (for messages)."""
    record = read_record(run_dir)
    if not record or not record.get("attempts"):
        return "no recorded attempt"
    last = record["attempts"][-1]
    status, step = last.get("status"), last.get("step")
    at = f" at step {step}" if step is not None else ""
    if status == RUNNING:
        return f"killed{at} (its process {last.get('pid')} is gone without a word: SIGKILL, out of memory, power)"
    if status == INTERRUPTED:
        return f"interrupted{at} by {last.get('signal', 'a signal')}"
    if status == FAILED:
        return f"failed{at}: {str(last.get('error', ''))[:200]}"
    return f"{status}{at}"


# ---------------------------------------------------------------------------------------------- checkpoints
def resumable_checkpoint(run_dir: Path) -> tuple[Path | None, str]:
    """The checkpoint to resume `run_dir` from, and a note when it is not an intact `checkpoints/last.ckpt`.

    The intact checkpoint of the highest step: last.ckpt when it is intact and at least as new by step as every
    intact `*step=<N>*.ckpt` beside it; else the periodic file of the highest step that reads back intact (a run
    killed between writing a periodic file and pointing last.ckpt at it, or a missing, dangling or damaged
    last.ckpt). Steps, never modification times, decide (`checkpoint_files.checkpoint_step`); `nonfinite-*` files,
    the NaN guard's pre-divergence states, are never picked automatically. FSDP2's distributed-checkpoint folders
    (`last.ckpt/`, `step=<N>.ckpt/`) are ranked and checked the same way (`checkpoint_files.checkpoint_problem`).
    """
    folder = Path(run_dir) / "checkpoints"
    last = folder / "last.ckpt"
    candidates = _periodic_by_step(folder)
    if last.is_file() or last.is_dir():
        problem = checkpoint_problem(last)
        if problem is None:
            return _last_or_newer(last, candidates)
    elif last.is_symlink():
        problem = f"a dangling link (to {os.readlink(last)})"
    else:
        problem = "missing"
    for _, p in candidates:
        if checkpoint_problem(p) is None:
            return p, f"{last} is {problem}; using {p.name}, the newest intact checkpoint beside it"
    if candidates:
        return None, f"{last} is {problem} and no step=*.ckpt beside it reads back intact"
    return None, "" if problem == "missing" else f"{last} is {problem} and there is no step=*.ckpt beside it"


def _periodic_by_step(folder: Path) -> list[tuple[int, Path]]:
    """(step, file) of the `*step=<N>*.ckpt` files in `folder` a run may resume from, highest step first."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.glob("*.ckpt"):
        step = step_in_name(p)
        if step is not None and p.name != "last.ckpt" and not p.name.startswith("nonfinite") and p.exists():
            found.append((step, p))
    return sorted(found, key=lambda item: (item[0], item[1].name), reverse=True)


def _last_or_newer(last: Path, candidates: list[tuple[int, Path]]) -> tuple[Path, str]:
    """An intact last.ckpt, unless an intact periodic file beside it holds a later step (then that file). Only the
    periodic files that last.ckpt is pointed at count: a `best-*` file (BestCheckpoint's) can be the state of an
    abandoned continuation after a rewind, which BestCheckpoint prunes once the run has resumed."""
    candidates = [(step, p) for step, p in candidates if not p.name.startswith("best")]
    if not candidates or same_checkpoint(last, candidates[0][1]):
        return last, ""  # the usual case: last.ckpt is a hard link of the newest periodic file
    last_step = checkpoint_step(last, [p for _, p in candidates])
    if last_step is None:
        return last, ""  # its step cannot be read: loading it names what is wrong
    for step, p in candidates:
        if step <= last_step:
            break
        if checkpoint_problem(p) is None:
            return p, (
                f"{p.name} (step {step}) is newer than {last} (step {last_step}), which was not yet pointed at it "
                f"(the run stopped between the two writes); using {p.name}"
            )
    return last, ""


# ---------------------------------------------------------------------------------------------- what changed
# What a resume may change, and how each change is applied; every other difference is refused. Keys are the resolved
# configuration's dotted keys with `init_args` dropped (data.seq_len, not data.init_args.seq_len), fnmatch patterns.
# The check (`classify_changes`), the refusal's table (`policy_table`) and docs/reliability.md's table
# (`policy_markdown`, checked by tests/e2e/reliability/test_resume_policy.py) are all made from this one list.
RESUME_POLICY: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "model.optim.lr",
            "model.optim.betas",
            "model.optim.eps",
            "model.optim.weight_decay",
            "model.optim.warmup_steps",
            "model.optim.min_lr_ratio",
            "model.optim.decay_steps",
            "model.optim.fused",
        ),
        "applied to the restored optimizer and schedule (RunSession; moments and step counts stay restored)",
    ),
    (
        ("trainer.*",),
        "the trainer is built from the new values (max_steps, validation and logging cadence, clipping, "
        "precision, devices, callbacks)",
    ),
    (("budget.*",), "the budget is built from the new values"),
    (
        ("model.config.dropout", "model.compile", "model.eval_contexts", "model.eval_stride"),
        "the module is built from the new values",
    ),
)
REFUSED_NOTE = (
    "everything else (the architecture model.config.*, the tokenizer and data data.*, seed_everything, "
    "model.optim.logit_control, ...): refused, a resumed run must stay the same experiment"
)
MAY_CHANGE = tuple(pattern for patterns, _ in RESUME_POLICY for pattern in patterns)
IGNORED = ("ckpt_path", "on_unfinished", "memory_check", "trainer.logger", "trainer.logger.*", "config", "__path__")
# Changing these is applied to the restored optimizer and schedule by RunSession (Lightning restores the saved ones).
OPTIMIZER_KEYS = tuple(k for k in MAY_CHANGE if k.startswith("model.optim."))


def _short_patterns(patterns: tuple[str, ...]) -> str:
    """`model.optim.lr, betas, eps` rather than the prefix again on every name."""
    first, *rest = patterns
    prefix = first.rsplit(".", 1)[0] + "."
    return ", ".join([first] + [p.removeprefix(prefix) if p.startswith(prefix) else p for p in rest])


def policy_table() -> str:
    """What a resume may change and how, as the refusal prints it (from RESUME_POLICY, the list the check uses)."""
    lines = ["What a resume may change (run_dir.RESUME_POLICY):"]
    lines += [f"  - {_short_patterns(patterns)}: {how}" for patterns, how in RESUME_POLICY]
    lines.append(f"  - {REFUSED_NOTE}.")
    return "\n".join(lines)


def policy_markdown() -> str:
    """The same table in Markdown, for docs/reliability.md."""
    lines = ["| setting | on resume |", "|---|---|"]
    lines += [f"| `{'`, `'.join(patterns)}` | allowed: {how} |" for patterns, how in RESUME_POLICY]
    lines.append(
        f"| {REFUSED_NOTE.split(':')[0]} | refused, naming each setting, its old and new value, and the "
        "command that resumes the run as it was |"
    )
    return "\n".join(lines)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of nested dicts (lists are values); `init_args` levels are dropped from the names."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            if key == "init_args":
                out.update(flatten(value, prefix))
                continue
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    else:
        out[prefix] = json.loads(json.dumps(tree, default=str))  # tuples -> lists, paths -> str
    return out


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new)} for every setting that differs, ignoring the ones that name the run or its checkpoint."""
    a, b = flatten(old), flatten(new)
    changes = {}
    for key in sorted(set(a) | set(b)):
        if any(fnmatch.fnmatchcase(key, pat) for pat in IGNORED):
            continue
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            changes[key] = (a.get(key, "<unset>"), b.get(key, "<unset>"))
    return changes


def classify_changes(changes: dict[str, tuple[Any, Any]]) -> tuple[dict, dict]:
    """(allowed, refused) parts of `changes` (see MAY_CHANGE)."""
    allowed = {k: v for k, v in changes.items() if any(fnmatch.fnmatchcase(k, p) for p in MAY_CHANGE)}
    return allowed, {k: v for k, v in changes.items() if k not in allowed}


def describe_changes(changes: dict[str, tuple[Any, Any]], limit: int = 8) -> str:
    items = [f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in list(changes.items())[:limit]]
    more = f"; and {len(changes) - limit} more" if len(changes) > limit else ""
    return "; ".join(items) + more


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------- resolving
@dataclass
class FitPlan:
    """Where a `fit` writes and what it resumes from."""

    run_dir: Path
    ckpt_path: str | None  # a concrete checkpoint file, or None for a fresh start
    resuming: bool
    auto_resumed: bool = False  # resumed without --ckpt_path (the same command again)
    notes: list[str] = field(default_factory=list)

    @property
    def previous_config(self) -> Path | None:
        files = config_files(self.run_dir) if self.resuming else []
        return files[-1] if files else None


def command_line(argv: list[str], drop: tuple[str, ...] = (), add: tuple[str, ...] = ()) -> str:
    """The command line of this process with some flags dropped (with their values) and others added."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop:
            skip = "=" not in arg
            continue
        out.append(arg)
    return shlex.join(["lightning_cqk", *out, *add])


def resolve_fit(
    root: Path,
    base: str,
    version: str | None,
    ckpt_request: str | None,
    on_unfinished: str = "resume",
    argv: list[str] | None = None,
) -> FitPlan:
    """Decide the run directory and the checkpoint of a `fit` (module docstring). Writes nothing.

    Args:
        root: `<save_dir>/<experiment>`.
        base: the run name without suffix.
        version: an explicit run directory name (--trainer.logger.init_args.version), or None.
        ckpt_request: --ckpt_path as given: None, "last" or a file.
        on_unfinished: what a launch without --ckpt_path does beside an unfinished run: resume / new / refuse.
        argv: the command line (without the program name), for the commands the messages suggest.
    """
    if on_unfinished not in ON_UNFINISHED:
        raise ResumeRefused(f"--on_unfinished must be one of {', '.join(ON_UNFINISHED)}, got {on_unfinished!r}.")
    argv = list(sys.argv[1:] if argv is None else argv)
    if ckpt_request not in (None, "last"):
        return _resolve_file(root, base, version, Path(ckpt_request))
    if version is not None:
        return _resolve_named(root / version, ckpt_request, on_unfinished, argv)
    dirs = [d for d in numbered_dirs(root, base) if not is_husk(d)]
    if ckpt_request == "last":
        notes = []
        for d in reversed(dirs):
            state = run_state(d)
            if state.status == "running":  # the run to resume is live: the lock refuses, naming its process
                return FitPlan(d, None, False, notes=notes)
            if state.checkpoint is not None:
                if state.note:
                    notes.append(f"{d}: {state.note}.")
                return FitPlan(d, str(state.checkpoint), True, notes=notes)
            why = state.note or "no checkpoint (it stopped before its first save)"
            notes.append(f"{d} has {why}; passed over.")
        name = next_free_name(root, base)
        notes.append(f"--ckpt_path last: no run named {base} under {root} has a checkpoint; starting {name} afresh.")
        return FitPlan(root / name, None, False, notes=notes)
    # No --ckpt_path: a new run, unless the newest run of this name is unfinished and resumable.
    name = next_free_name(root, base)
    if not dirs:
        return FitPlan(root / name, None, False)
    newest = run_state(dirs[-1])
    new_plan = FitPlan(root / name, None, False)
    if newest.status == "running":
        new_plan.notes.append(f"{newest.path} is in use by a live run (pid {newest.live.pid}); this run is {name}.")
        return new_plan
    if newest.status == "finished":
        new_plan.notes.append(
            f"{newest.path} holds a finished run; this is a new run, {name}. (To continue that one instead, e.g. "
            "with a larger --trainer.max_steps: --ckpt_path last.)"
        )
        return new_plan
    if newest.status == "legacy" or newest.checkpoint is None:
        why = "has no record of how it ended" if newest.status == "legacy" else "has nothing to resume from"
        detail = f" ({newest.note})" if newest.note else ""
        new_plan.notes.append(f"{newest.path} {why}{detail}; this is a new run, {name}.")
        return new_plan
    # Unfinished and resumable.
    resume_cmd = command_line(argv, drop=("--ckpt_path", "--on_unfinished"), add=("--ckpt_path", "last"))
    new_cmd = command_line(argv, drop=("--on_unfinished",), add=("--on_unfinished", "new"))
    if on_unfinished == "new":
        new_plan.notes.append(f"{newest.path} is unfinished ({describe_end(newest.path)}); starting a new run, {name}.")
        return new_plan
    if on_unfinished == "refuse":
        raise ResumeRefused(
            f"{newest.path} is an unfinished run of this name ({describe_end(newest.path)}). To resume it: "
            f"{resume_cmd}\nTo start a new run beside it: {new_cmd}"
        )
    plan = FitPlan(newest.path, str(newest.checkpoint), True, auto_resumed=True)
    plan.notes.append(
        f"{newest.path} is unfinished ({describe_end(newest.path)}): resuming it from {newest.checkpoint}"
        + (f" ({newest.note})" if newest.note else "")
        + f". To start a new run instead: {new_cmd}"
    )
    return plan


def _resolve_named(run_dir: Path, ckpt_request: str | None, on_unfinished: str, argv: list[str]) -> FitPlan:
    """An explicit run directory (--trainer.logger.init_args.version): resume it, start it, or refuse."""
    if not run_dir.exists() or is_husk(run_dir):
        note = [] if ckpt_request is None else [f"--ckpt_path last: {run_dir} has no checkpoint yet; starting afresh."]
        return FitPlan(run_dir, None, False, notes=note)
    state = run_state(run_dir)
    if state.status == "running":
        return FitPlan(run_dir, None, False)  # the lock refuses it, naming the live run
    if ckpt_request == "last" or (state.status == "unfinished" and on_unfinished == "resume"):
        if state.checkpoint is None:
            raise ResumeRefused(
                f"{run_dir} holds a run but no checkpoint to resume from ({state.note or 'none written yet'}). "
                "Choose another --trainer.logger.init_args.version for a new run, or delete that directory."
            )
        notes = [f"{run_dir}: {state.note}."] if state.note else []
        return FitPlan(run_dir, str(state.checkpoint), True, auto_resumed=ckpt_request is None, notes=notes)
    kind = "a finished run" if state.status == "finished" else f"a run ({describe_end(run_dir)})"
    raise ResumeRefused(
        f"{run_dir} already holds {kind}; a new run must not write into it. Choose another "
        "--trainer.logger.init_args.version, or resume it with --ckpt_path last."
    )


def _resolve_file(root: Path, base: str, version: str | None, ckpt: Path) -> FitPlan:
    if not ckpt.exists():
        raise ResumeRefused(f"--ckpt_path {ckpt}: no such file.")
    if version is not None:
        return FitPlan(root / version, str(ckpt), True)
    owner = checkpoint_run(ckpt)
    if owner is not None:
        return FitPlan(owner, str(ckpt), True)
    name = next_free_name(root, base)
    return FitPlan(root / name, str(ckpt), True, notes=[f"{ckpt} is not inside a run directory; this run is {name}."])


# ------------------------------------------------------------------------------------------------ ownership
@dataclass
class RunDirectory:
    """A run directory this process owns: the lock, whether it created it, and its record."""

    path: Path
    created: bool
    lock: Any = None

    @staticmethod
    def claim(path: Path, log=print) -> RunDirectory:
        """Lock `path` (creating it); remember whether it existed.

        Only a directory this launch creates, or the husk of an earlier launch (nothing but its unheld `.lock`), is
        removed after a failed launch: an existing empty directory is someone else's and stays.
        """
        path = Path(path)
        created = not path.exists() or (is_husk(path) and (path / LOCK_NAME).is_file())
        lock = acquire(path, log=log)
        return RunDirectory(path, created, lock)

    # ----------------------------------------------------------------------------------- attempts
    def start_attempt(self, **fields: Any) -> dict[str, Any]:
        record = read_record(self.path) or {"name": self.path.name, "created": now(), "attempts": []}
        attempt = {
            "n": len(record["attempts"]) + 1,
            "status": RUNNING,
            "started": now(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "process_start": process_start(os.getpid()),
            "argv": list(sys.argv),
            "revision": code_revision(),
            "packages": package_versions(),
            **({"identity": identity} if (identity := env_text(RUN_IDENTITY_ENV)) else {}),
            **fields,
        }
        record["attempts"].append(attempt)
        write_json_atomically(self.path / RECORD_NAME, record)
        return attempt

    def end_attempt(self, **fields: Any) -> None:
        record = read_record(self.path)
        if not record or not record.get("attempts") or record["attempts"][-1].get("pid") != os.getpid():
            return
        record["attempts"][-1].update(ended=now(), **fields)
        write_json_atomically(self.path / RECORD_NAME, record)

    def started(self) -> bool:
        record = read_record(self.path)
        return bool(record and record.get("attempts") and record["attempts"][-1].get("pid") == os.getpid())

    def abandon(self, log=print) -> None:
        """After a launch that failed before training started: remove the directory if this process created it."""
        if self.created and not self.started() and self.path.is_dir():
            self.discard(log=lambda m: log(f"{m}, which failed before training started."))
        elif self.lock is not None:
            self.lock.release()

    def discard(self, log=print) -> bool:
        """Remove the directory this process created, everything in it, and release its lock (a launch that failed
        or stopped before its first optimizer step: nothing in it is worth keeping). True when it is gone."""
        if self.created and self.path.is_dir():
            for child in self.path.iterdir():  # everything but the lock, while still holding it
                if child.name != LOCK_NAME:
                    shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
            if self.lock is not None:
                self.lock.release()
            try:
                self.path.rmdir()  # fails harmlessly when another launch has taken the directory meanwhile
            except OSError:
                return False
            log(f"run directory: removed {self.path}, created by this launch")
            return True
        if self.lock is not None:
            self.lock.release()
        return False
