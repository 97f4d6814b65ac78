"""The task YAML files of `eval --include_path`, read before lm-eval indexes them.

lm-eval's task index skips, with a debug-level log line only, every file it cannot read: a YAML syntax error, an
empty file, a list instead of a mapping, an `include:` of a file that is not there. The task defined in it is then
reported as an unknown task, which hides the cause. `check_task_folder` reads every `*.yaml` under the folder (as
lm-eval does, `__pycache__` and `.ipynb_checkpoints` left out) with `lightning_cqk.strict_yaml`, which only composes
the document (a `!function` tag is looked at, never imported or run), and refuses the first such file by its name and
line; a key given twice (which lm-eval's loader would silently resolve to the last) is refused the same way.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_cqk.strict_yaml import YAMLInputError, check_text, construct

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
        where = f"Task YAML {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise YAMLInputError(f"{where} is not UTF-8 text ({err}); {_SKIPPED}. Save it as UTF-8.") from None
        try:
            node = check_text(text, where)
            construct(text, where, _TaskLoader)  # e.g. `doc_to_text: {{x}}` composes but has an unhashable key
        except YAMLInputError as err:
            raise YAMLInputError(f"{err} ({_SKIPPED}.)") from None
        if not isinstance(node, yaml.MappingNode):
            shape = "is empty" if node is None else f"holds a {node.id}, not a mapping of task settings"
            raise YAMLInputError(
                f"{where} {shape}; {_SKIPPED}. A task file maps settings to values (task: <name>, dataset_path: ..., "
                "output_type: ...); see docs/evaluation.md."
            )
        _check_includes(path, node, where)


def _check_includes(path: Path, node: yaml.MappingNode, where: str) -> None:
    for key_node, value_node in node.value:
        if key_node.value != "include":
            continue
        values = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for item in values:
            name = getattr(item, "value", None)
            if not isinstance(name, str):
                continue
            target = Path(name) if Path(name).is_absolute() else path.parent / name
            if not target.is_file():
                line = item.start_mark.line + 1
                raise YAMLInputError(
                    f"{where}, line {line}: include: {name} names no file ({target} does not exist); {_SKIPPED}. Fix "
                    "the path (it is relative to the task file's folder)."
                )
