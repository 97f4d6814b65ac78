"""`lightning_cqk check-backend NAME_OR_PATH [--options JSON] [--config JSON]`: the contract checks as a table.

The backend is a built-in's name, an installed plugin's (entry-point group `lightning_cqk.attention`) or a
`package.module:Class` path; `--options` are its options (a JSON object), `--config` overrides of the tiny model
(`contract.cases.BASE_CONFIG`, e.g. '{"position": "none"}'). Each check of `contract.checks` is one row: `pass` with
what it measured, `FAIL` with what broke, or `n/a` saying why it cannot apply to this backend (a note, not a pass).
A model that does not build fails the first row and the others are not run. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_cqk.attention.registry import first_line
from lightning_cqk.contract import checks
from lightning_cqk.contract.cases import BASE_CONFIG, Case
from lightning_cqk.errors import ConfigError

#: (row label, check) in the order the table prints them.
CHECKS: list[tuple[str, Callable[[Case], str]]] = [
    ("builds", checks.check_builds),
    ("causality (layer)", checks.check_layer_causality),
    ("causality (model)", checks.check_model_causality),
    ("batch rows independent", checks.check_batch_rows),
    ("deterministic", checks.check_deterministic),
    ("fast path == math path", checks.check_fast_equals_math),
    ("fp32 forward/backward", checks.check_fp32_finite),
    ("bf16 autocast", checks.check_bf16_autocast),
    ("decode (KV cache)", checks.check_decode_parity),
    ("torch.compile graphs", checks.check_compile_graphs),
    ("FLOPs declared", checks.check_flops),
    ("parameters", checks.check_parameters),
    ("state dict round trip", checks.check_state_dict),
    ("Q/K seam (QuacK, QK-clip)", checks.check_qk_seam),
    ("tiny GPT learns bytes", checks.check_learns_bytes),
]


@dataclass(frozen=True)
class Row:
    """One check's outcome: `result` is "pass", "FAIL", "n/a" or "not run"; `detail` what it measured or why."""

    check: str
    result: str
    detail: str
    seconds: float = 0.0


def run_checks(case: Case, selected: list[tuple[str, Callable[[Case], str]]] | None = None) -> list[Row]:
    """Every check on `case`, in order; a failing first row (the model does not build) leaves the rest not run."""
    rows: list[Row] = []
    for label, check in CHECKS if selected is None else selected:
        if rows and rows[0].check == "builds" and rows[0].result == "FAIL":
            rows.append(Row(label, "not run", "the model does not build"))
            continue
        start = time.perf_counter()
        try:
            result, detail = "pass", check(case)
        except checks.NotApplicable as note:
            result, detail = "n/a", str(note)
        except AssertionError as err:
            result, detail = "FAIL", str(err).removeprefix(f"{case.id}: ")
        except Exception as err:  # noqa: BLE001 - the backend's own code may raise anything: that is the failure
            result, detail = "FAIL", f"raised {first_line(err)}"
        rows.append(Row(label, result, detail, time.perf_counter() - start))
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table, then one summary line."""
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  result   seconds  what it measured", f"{'-' * width}  -------  -------  {'-' * 40}"]
    lines += [f"{r.check:<{width}}  {r.result:<7}  {r.seconds:7.1f}  {r.detail}" for r in rows]
    counts = {k: sum(r.result == k for r in rows) for k in ("pass", "FAIL", "n/a", "not run")}
    summary = f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['n/a']} not applicable (noted)"
    if counts["not run"]:
        summary += f", {counts['not run']} not run"
    return "\n".join([*lines, summary])


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'{flag} {text!r} is not JSON ({err.msg}); give an object, e.g. {flag} \'{{"impl": "math"}}\'.'
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object (name: value), got {text!r}.")
    return value


def check_backend_command(argv: list[str]) -> None:
    """The `check-backend` command (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk check-backend",
        description="Run the attention contract checks on one backend and print them as a table (exit 1 on a failure).",
    )
    parser.add_argument("backend", help="a registered name, an installed plugin's name, or package.module:Class")
    parser.add_argument("--options", default="{}", help="the backend's options as a JSON object")
    parser.add_argument("--config", default="{}", help=f"overrides of the tiny model {BASE_CONFIG} as a JSON object")
    args = parser.parse_args(argv)
    import torch

    from lightning_cqk import attention
    from lightning_cqk.attention.registry import label

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    options, config = _json_object(args.options, "--options"), _json_object(args.config, "--config")
    cls = attention.get_attention(args.backend)  # an unknown name or a path that does not import: one paragraph
    case = Case(args.backend, options, config)
    where = f"{cls.__module__}:{cls.__qualname__}"
    print(f"check-backend {args.backend} ({where}; registered as {label(cls)!r}), options {json.dumps(options)}")
    print(f"tiny model: {json.dumps({**BASE_CONFIG, **config})}, fp64 unless the check says otherwise\n")
    rows = run_checks(case)
    print(format_table(rows))
    if any(r.result == "FAIL" for r in rows):
        sys.exit(1)
