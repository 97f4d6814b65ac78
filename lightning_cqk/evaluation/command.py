"""`lightning_cqk eval`: lm-evaluation-harness tasks on a checkpoint, through ``lm_eval.simple_evaluate``.

    lightning_cqk eval --checkpoint runs/<experiment>/<run>/checkpoints/last.ckpt --tasks hellaswag,arc_easy
    lightning_cqk eval --checkpoint <ckpt> --tasks my_task --include_path my_tasks/ --limit 100

Prints lm-eval's table and writes lm-eval's results (JSON) beside the checkpoint, as
``<checkpoint stem>.lm_eval-<tasks>-<k>shot.json`` (a ``-2``, ``-3``, ... suffix keeps an earlier result), or to
``--output``. Task names are lm-eval's (``lm-eval ls tasks``) or those of the task YAML files under
``--include_path`` (which take precedence; when every task is found there, lm-eval's 200+ built-in task folders
are not indexed, which saves ~10 s). A task YAML there that lm-eval could not read (a syntax error, a duplicate key,
an `include:` of a missing file) is refused by its file and line (`task_files.py`) instead of being skipped and its
task called unknown. docs/evaluation.md has the conventions and how to run a task on local data.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from lightning_cqk.evaluation import LM_EVAL_MISSING
from lightning_cqk.evaluation.task_files import check_task_folder
from lightning_cqk.files.atomic import write_json_atomically


def read_hub_data_from_cache_when_offline() -> None:
    """When the Hugging Face Hub cannot be reached (the same probe as `fit`'s corpus download, at most
    `HUB_PROBE_SECONDS`), set the Hub and `datasets` offline before they are imported: a task's data then comes from
    the local datasets cache or fails at once, instead of after five retries of growing waits (32 s)."""
    from lightning_cqk.data.corpora import OFFLINE_VARIABLES, hub_unreachable

    why = hub_unreachable()
    if why is None or why.startswith("this machine is set offline"):
        return
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    print(f"lightning_cqk eval: the Hugging Face Hub is out of reach ({why}); task data is read from the local "
          "datasets cache only.", file=sys.stderr, flush=True)  # fmt: skip


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise SystemExit(f"lightning_cqk eval: {LM_EVAL_MISSING}") from None


def task_manager_for(tasks: list[str], include_path: str | None):
    """A ``TaskManager`` that knows every task: the include path's alone when it has them all, else with lm-eval's.

    Raises:
        ValueError: a task name that neither knows, with the closest names.
    """
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        if not Path(include_path).is_dir():
            raise ValueError(f"--include_path {include_path} is not a directory (a folder of lm-eval task YAML files).")
        check_task_folder(include_path)  # a file lm-eval cannot read is named, not skipped (task_files.py)
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(local.match_tasks([t]) for t in tasks):
            return local
    manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        where = f" nor under --include_path {include_path}" if include_path else ""
        raise ValueError(
            f"Unknown lm-eval task(s) {', '.join(hints)}: not one of lm-eval's tasks{where}. List them with "
            "`lm-eval ls tasks`, or define a task in a YAML file and pass its folder with --include_path "
            "(docs/evaluation.md)."
        )
    return manager


def default_output(checkpoint: str, tasks: list[str], num_fewshot: int | None, limit: float | None) -> Path:
    """``<checkpoint dir>/<stem>.lm_eval-<tasks>-<k>shot[-limit<L>].json``, never an existing file."""
    names = "+".join(re.sub(r"[^A-Za-z0-9_.-]", "_", t) for t in tasks)
    if len(names) > 80:
        names = f"{len(tasks)}tasks-{hashlib.sha1(names.encode()).hexdigest()[:8]}"
    shots = "default" if num_fewshot is None else str(num_fewshot)
    ckpt = Path(checkpoint)
    stem = f"{ckpt.stem}.lm_eval-{names}-{shots}shot" + (f"-limit{limit:g}" if limit is not None else "")
    path, n = ckpt.parent / f"{stem}.json", 2
    while path.exists():
        path, n = ckpt.parent / f"{stem}-{n}.json", n + 1
    return path


def lm_evaluate(
    checkpoint: str,
    tasks: str,
    num_fewshot: int | None = None,
    batch_size: int = 16,
    limit: float | None = None,
    include_path: str | None = None,
    output: str | None = None,
    device: str | None = None,
    dtype: str = "float32",
    prefix_eos: bool = False,
    max_gen_toks: int | None = None,
    gen_kwargs: str | None = None,
    seed: int = 1234,
    bootstrap_iters: int = 100000,
    log_samples: bool = False,
    tokenizer: str | None = None,
    bpe_file: str | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint on lm-eval tasks; print lm-eval's table; write the results JSON; return them.

    Args:
        checkpoint: the LM's ``.ckpt`` (written by ``lightning_cqk fit``); its own tokenizer is used.
        tasks: comma-separated lm-eval task (or group) names, e.g. ``hellaswag,arc_easy,piqa,lambada_openai``.
        num_fewshot: solved examples before each question (default: each task's own, else 0).
        batch_size: sequences per forward.
        limit: evaluate only the first this many documents of each task (a fraction when < 1); for quick checks,
            the scores are then not the benchmark's.
        include_path: a folder of task YAML files (e.g. a task on local jsonl files: docs/evaluation.md).
        output: the results JSON (default: beside the checkpoint, see the module docstring).
        device: torch device (default: cuda when available, else cpu).
        dtype: float32 | bfloat16 | float16 | float64.
        prefix_eos: put EOS before every context (mc-eval's convention) instead of lm-eval's (docs/evaluation.md).
        max_gen_toks: generation budget of generate_until tasks that do not set one (default min(256, block/2)).
        gen_kwargs: generation settings that override the tasks', ``key=value,key=value`` (lm-eval's --gen_kwargs).
        seed: lm-eval's seeds (python, numpy, torch, few-shot sampling) and the sampling generator's.
        bootstrap_iters: bootstrap draws of lm-eval's standard errors (0: none; lm-eval's default 100000).
        log_samples: also write every document's requests and responses (``samples``) into the JSON.
        tokenizer: the checkpoint's tokenizer name (default: read from it).
        bpe_file: local BPE vocabulary file.
    """
    _require_lm_eval()
    import lm_eval
    from lm_eval.utils import handle_non_serializable, make_table

    from lightning_cqk.evaluation.lm import CQKLM

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise ValueError("--tasks is empty; give lm-eval task names, e.g. --tasks hellaswag,arc_easy.")
    if include_path is not None and Path(include_path).is_dir():
        check_task_folder(include_path)  # the cheap reads first: a bad task file is named before a model is loaded
    lm = CQKLM(  # first: a missing, damaged or untrusted checkpoint is refused before lm-eval indexes its tasks
        checkpoint=checkpoint,
        tokenizer=tokenizer,
        bpe_file=bpe_file,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        prefix_eos=prefix_eos,
        max_gen_toks=max_gen_toks,
        seed=seed,
    )
    manager = task_manager_for(names, include_path)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=names,
        num_fewshot=num_fewshot,
        limit=limit,
        gen_kwargs=gen_kwargs,
        task_manager=manager,
        bootstrap_iters=bootstrap_iters,
        log_samples=log_samples,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    results["config"]["model"] = "lightning_cqk"
    results["config"]["model_args"] = {"checkpoint": checkpoint, "batch_size": batch_size, "dtype": dtype}
    print(f"lightning_cqk ({checkpoint}), num_fewshot: {num_fewshot}, limit: {limit}, batch_size: {batch_size}")
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    path = Path(output) if output else default_output(checkpoint, names, num_fewshot, limit)
    write_json_atomically(path, results, default=handle_non_serializable, ensure_ascii=False)
    print(f"results: {path}")
    return results


def eval_command(argv: list[str]) -> None:
    """``lightning_cqk eval ...`` (jsonargparse over ``lm_evaluate``)."""
    read_hub_data_from_cache_when_offline()
    _require_lm_eval()
    from jsonargparse import CLI

    try:
        CLI(lm_evaluate, args=argv, prog="lightning_cqk eval", as_positional=False)
    except ConnectionError as err:  # lm-eval's tasks download their data from the Hugging Face Hub
        raise SystemExit(
            f"lightning_cqk eval: a task's data could not be downloaded ({err}). lm-eval's tasks read their data from "
            "the Hugging Face Hub; offline, give the datasets cache that holds them (HF_DATASETS_CACHE=... "
            "HF_DATASETS_OFFLINE=1) or define the task on local files and pass its folder with --include_path "
            "(docs/evaluation.md)."
        ) from None
