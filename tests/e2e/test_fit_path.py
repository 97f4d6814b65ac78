"""How far `lightning_cqk fit` is from the attention forward, in files of the package a reader follows (issue 46).

A tiny in-process `fit` is traced with `sys.setprofile` until the first call of an attention backend's `forward`.
Counted: the files on the call stack at that forward (main -> CLI -> LightningModule -> GPT -> backend), and every
file whose functions the command line's own code (`cli/`) calls on the way: the steps a reader follows to see how a
run is assembled. Code run while a module is imported (class bodies, module constants) is not counted, nor what
Lightning or jsonargparse call by themselves (a callback's hooks, a DataModule's setup).

Before issue 46: 30 files (`cli/glue.py` sniffed every fit's config files; `CQKCLI` called the run directory, launch,
lock, strategy, outputs, memory check, SLURM and nine callback modules itself). Now 13: the command line's reading
of its arguments (main, error_report, environment, class_paths, resources, strict_yaml), `CQKCLI` with its parser
(trainer, presets), the run's preflight called once (run/preflight.py), the run's callbacks put in place once
(callbacks/run_stack.py), then module -> model/gpt -> the backend.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tiny_run import tiny_fit

import lightning_cqk
from lightning_cqk.cli import main

PACKAGE = str(Path(lightning_cqk.__file__).resolve().parent) + os.sep
#: Files from `fit` to the attention forward (issue 46: 13 or fewer).
MAX_FILES = 13


class _FirstForward(Exception):
    pass


def files_to_first_forward(argv: list[str]) -> list[str]:
    """The package files (relative paths) on `fit`'s path to the first attention forward, in the order met."""
    stack: list[str] = []
    called: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        rel = frame.f_code.co_filename[len(PACKAGE) :]
        if rel.startswith("attention" + os.sep) and frame.f_code.co_name == "forward":
            sys.setprofile(None)
            f = frame
            while f is not None:
                if f.f_code.co_filename.startswith(PACKAGE):
                    stack.insert(0, f.f_code.co_filename[len(PACKAGE) :])
                f = f.f_back
            raise _FirstForward
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(PACKAGE + "cli" + os.sep):
            return
        f = caller
        while f is not None:  # code run by an import (a class body, a module constant) is not a step of the run
            if f.f_code.co_filename.startswith("<frozen importlib"):
                return
            f = f.f_back
        if rel not in called:
            called.append(rel)

    sys.setprofile(profile)
    try:
        main(argv)
    except _FirstForward:
        pass
    finally:
        sys.setprofile(None)
    assert stack, "the run ended without an attention forward"
    return list(dict.fromkeys([*called, *stack]))


def test_fit_reaches_the_attention_forward_through_few_files(tiny_shards: Path, tmp_path: Path):
    files = files_to_first_forward(tiny_fit(tiny_shards, tmp_path / "runs", "--trainer.max_steps=1"))
    assert files[-1].startswith("attention"), files
    assert len(files) <= MAX_FILES, f"{len(files)} files from fit to the attention forward:\n" + "\n".join(files)
