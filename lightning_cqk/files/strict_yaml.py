"""YAML that cannot silently change meaning: syntax errors and duplicate mapping keys are refused, naming the line.

PyYAML's `safe_load` keeps the last of two equal keys (`{a: 1, a: 2}` is `{a: 2}`), so a copy-pasted level, override
or claim replaces the first without a word. `load` reads like `safe_load` but first composes the document (YAML's
node graph, before any tag is constructed, so `!function` tags of lm-eval task files are only looked at) and refuses
a key that appears twice in one mapping, naming both lines. `key_lines` gives the line of every key and list item,
for messages about values that parse but are wrong; `check_config_args` applies the same to the `--config` files of a
`fit`/`validate`/... command line (jsonargparse would keep the last of two keys). Standard library + PyYAML only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lightning_cqk.errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLInputError(ConfigError):
    """A YAML file that does not parse, or whose meaning a duplicate key would silently change."""


def _refusal(err: yaml.YAMLError, where: str) -> YAMLInputError:
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(p) for p in (err.context, err.problem) if p)
        return YAMLInputError(f"{where}{at}: not valid YAML ({problem}). Fix the file there and run again.")
    return YAMLInputError(f"{where}: not valid YAML ({err}). Fix the file and run again.")


def _compose(text: str, where: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as err:
        raise _refusal(err, where) from None


def construct(text: str, where: str, loader: type = _Loader) -> Any:
    """`yaml.load(text, Loader=loader)`, a failure (e.g. an unhashable key, an unknown tag) refused with its line."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 (a safe loader: the default, or a subclass of one)
    except yaml.YAMLError as err:
        raise _refusal(err, where) from None


def _scalar_key(node: yaml.Node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def duplicate_keys(node: yaml.Node | None) -> list[tuple[str, int, int, list[str]]]:
    """Every key that appears twice in one mapping: (key, first line, second line, path of the mapping)."""
    found: list[tuple[str, int, int, list[str]]] = []

    def walk(n: yaml.Node | None, path: list[str], seen_nodes: set[int]) -> None:
        if n is None or id(n) in seen_nodes:  # anchors/aliases share nodes
            return
        seen_nodes.add(id(n))
        if isinstance(n, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value_node in n.value:
                key = _scalar_key(key_node)
                if key is not None and key != "<<":
                    line = key_node.start_mark.line + 1
                    if key in first:
                        found.append((key, first[key], line, path))
                    else:
                        first[key] = line
                walk(value_node, [*path, str(key)], seen_nodes)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, [*path, str(i)], seen_nodes)

    walk(node, [], set())
    return found


def key_lines(node: yaml.Node | None) -> dict[tuple[str, ...], int]:
    """Line (1-based) of every mapping key and list item, by its path: ('profiles', 'cpu', 'seeds', '0') -> 12."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(n: yaml.Node | None, path: tuple[str, ...]) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                key = (*path, str(_scalar_key(key_node)))
                lines.setdefault(key, key_node.start_mark.line + 1)
                walk(value_node, key)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                lines.setdefault((*path, str(i)), item.start_mark.line + 1)
                walk(item, (*path, str(i)))

    walk(node, ())
    return lines


def check_text(text: str, where: str) -> yaml.Node | None:
    """Compose `text` and refuse a syntax error or a duplicate key (naming the line); returns the node graph."""
    node = _compose(text, where)
    dups = duplicate_keys(node)
    if dups:
        key, first, second, path = dups[0]
        inside = f" (in {'.'.join(path)})" if path else ""
        more = f" ({len(dups) - 1} more duplicate key(s) after it)" if len(dups) > 1 else ""
        raise YAMLInputError(
            f"{where}, line {second}: key {key!r}{inside} appears twice (first on line {first}); YAML would keep only "
            f"the second and silently drop the first{more}. Keep one of them (rename or merge the two)."
        )
    return node


def check_config_args(argv: list[str]) -> list[Any]:
    """Refuse a `--config FILE` of a command line whose YAML has a syntax error or a key given twice (naming the
    file and line): jsonargparse reads config files with `safe_load`, which keeps the last of two equal keys.
    Returns the documents read, in order (what the command line reads from them, e.g. which model they name)."""
    documents = []
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None
        if arg.startswith("--config="):
            value = arg[len("--config=") :]
        if value is None or value.lstrip().startswith(("{", "[")) or not Path(value).is_file():
            continue  # inline YAML, or a path the CLI itself reports as missing
        try:
            text = Path(value).read_text()
        except (OSError, UnicodeDecodeError):
            continue  # the CLI's own reading reports it
        check_text(text, f"--config {value}")
        documents.append(construct(text, f"--config {value}"))
    return documents


def load(path: str | Path, where: str | None = None) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Read a YAML file like `yaml.safe_load`, refusing syntax errors and duplicate keys; (data, key_lines)."""
    path = Path(path)
    where = where or str(path)
    text = path.read_text()
    node = check_text(text, where)
    return construct(text, where), key_lines(node)
