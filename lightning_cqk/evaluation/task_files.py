"""The task YAML files of `eval --include_path`, read before lm-eval indexes them.

lm-eval's task index skips, with a debug-level log line only, every file it cannot read: a YAML syntax error, an
empty file, a list instead of a mapping, an `include:` of a file that is not there. The task defined in it is then
reported as an unknown task, which hides the cause. `check_task_folder` reads every `*.yaml` under the folder (as
lm-eval does, `__pycache__` and `.ipynb_checkpoints` left out) with `lightning_cqk.files.strict_yaml`, which only
composes the document (a `!function` tag is looked at, never imported or run), and refuses the first such file by its
name and line; a key given twice (which lm-eval's loader would silently resolve to the last) is refused the same way.
Every `include:` must name a file that is itself a task file (a mapping of settings), wherever it lies: a file outside
the folder, or not named *.yaml, is never indexed, so it is read here when included (`/etc/passwd` would otherwise make
lm-eval fail on the including task and call it unknown).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_cqk.files.strict_yaml import YAMLInputError, check_text, construct

_IGNORED_DIRS = {"__pycache__", ".ipynb_checkpoints"}


class _TaskLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """A safe loader that reads lm-eval's `!function module.name` tag as its text (nothing is imported)."""


_TaskLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
_SKIPPED = "lm-eval would skip this file without a word and call its task unknown"


def task_files(include_path: str | Path) -> list[Path]:
    """The `*.yaml` files lm-eval indexes under `include_path`, in its order."""
    root = Path(include_path)
    return sorted(
        (p for p in root.glob("**/*.yaml") if not any(part in _IGNORED_DIRS for part in p.parts)),
        key=lambda p: p.as_posix(),
    )


def check_task_folder(include_path: str | Path) -> None:
    """Refuse the first task YAML under `include_path` that lm-eval could not read (module docstring)."""
    for path in task_files(include_path):
        _check_includes(path, _read_task(path, f"Task YAML {path}"), f"Task YAML {path}", {path.resolve()})


class _NotATaskFile(Exception):
    """Why a file is no task file lm-eval can read (`reason`, naming it and the line) and how to fix it (`fix`)."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(reason)
        self.reason, self.fix = reason, fix


def _parse_task(path: Path, where: str) -> yaml.MappingNode:
    """The composed mapping of one task file; raises _NotATaskFile (`where` names the file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _NotATaskFile(f"{where} is not UTF-8 text ({err})", "Save it as UTF-8.") from None
    try:
        node = check_text(text, where)
        construct(text, where, _TaskLoader)  # e.g. `doc_to_text: {{x}}` composes but has an unhashable key
    except YAMLInputError as err:
        raise _NotATaskFile(str(err)) from None
    if not isinstance(node, yaml.MappingNode):
        shape = "is empty" if node is None else f"holds a {node.id}, not a mapping of task settings"
        raise _NotATaskFile(
            f"{where} {shape}",
            "A task file maps settings to values (task: <name>, dataset_path: ..., output_type: ...); see "
            "docs/evaluation.md.",
        )
    return node


def _read_task(path: Path, where: str) -> yaml.MappingNode:
    """A task file of the folder, refusing one lm-eval would skip (naming it and the line)."""
    try:
        return _parse_task(path, where)
    except _NotATaskFile as err:
        message = f"{err.reason}; {_SKIPPED}. {err.fix}" if err.fix else f"{err.reason} ({_SKIPPED}.)"
        raise YAMLInputError(message) from None


def _read_included(target: Path, where: str) -> yaml.MappingNode:
    """An included file's mapping, refusing one that is no task file (naming the including file, its line and the
    included file): lm-eval fails on the task that includes it and calls that task unknown."""
    try:
        return _parse_task(target, f"the included file {target}")
    except _NotATaskFile as err:
        raise YAMLInputError(
            f"{where} names no task file: {err.reason.rstrip('.')}. lm-eval would fail to read the task that includes "
            "it and call that task unknown. Include a task YAML (a mapping of task settings, e.g. a shared template "
            "beside the task file), or remove the include."
        ) from None


def _check_includes(path: Path, node: yaml.MappingNode, where: str, seen: set[Path]) -> None:
    """Every `include:` of a task file names a readable task file (a mapping of settings), and so do its own
    includes: a file outside the task folder (or not named *.yaml) is read here only, never by the folder's walk."""
    for key_node, value_node in node.value:
        if key_node.value != "include":
            continue
        values = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for item in values:
            name = getattr(item, "value", None)
            if not isinstance(name, str):
                continue
            target = Path(name) if Path(name).is_absolute() else path.parent / name
            line = item.start_mark.line + 1
            if not target.is_file():
                raise YAMLInputError(
                    f"{where}, line {line}: include: {name} names no file ({target} does not exist); {_SKIPPED}. Fix "
                    "the path (it is relative to the task file's folder)."
                )
            if target.resolve() in seen:
                continue
            seen.add(target.resolve())
            included = _read_included(target, f"{where}, line {line}: include: {name}")
            _check_includes(target, included, f"Task YAML {target} (included)", seen)
