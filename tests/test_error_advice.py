"""Every flag that a message of the package suggests is accepted by the command it is suggested for (issue 18).

The convention the messages follow (and this test enforces): a flag belongs to the command named last before it in
the same string, as `lightning_cqk <command> ...` or `<command>: --flag` (e.g. "fit: --data.source PATH; prepare:
--source PATH"); a string that names no command suggests flags of its module's command (`MODULE_COMMANDS`, else
`fit`). Flags after a foreign tool (`tensorboard --logdir`, `#SBATCH --array`, `sbatch --parsable`) or a module run as a
script (`python -m lightning_cqk.<module> --flag`) are not the CLI's.
Every string literal of the package is read (f-strings with their placeholders as `{}`), except documentation
(docstrings and other bare string statements) and strings without a space (argv pieces such as "--output").
`fit` is checked against both trainer CLIs (`CQKCLI` and the downstream `GlueCLI`: the config decides which runs).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from functools import cache
from pathlib import Path

import pytest

import lightning_cqk
from lightning_cqk.cli import EXTRA_COMMANDS, TRAINER_COMMANDS, main

PACKAGE = Path(lightning_cqk.__file__).parent
MODULE_COMMANDS = {
    "study/run/runner.py": "sweep",
    "study/design/spec.py": "sweep",
    "study/report/report_command.py": "report",
    "data/prepare.py": "prepare",
    "cli/glue_command.py": "glue",
    "downstream/multiple_choice.py": "mc-eval",
    "downstream/glue_table.py": "glue-table",
    "contract/backends_table.py": "attention",
    "inference/generate_command.py": "generate",
    "evaluation/command.py": "eval",
    "evaluation/lm.py": "eval",
}
GLOBAL_FLAGS = {"--debug"}  # taken by `main` before any command sees the arguments (cli/error_report.py)
COMMANDS = (*TRAINER_COMMANDS, *EXTRA_COMMANDS)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_.-]*[a-z0-9_])(\.\{\})?")
_NAMED = "|".join(re.escape(c) for c in sorted(COMMANDS, key=len, reverse=True))
_CONTEXT = re.compile(
    rf"\blightning_cqk (?P<cmd>{_NAMED})\b|(?<![\w-])(?P<short>{_NAMED}): (?=--)"
    r"|#SBATCH|\b(?:tensorboard|sbatch|srun|torchrun|git|pip)\b|\bpython -m lightning_cqk\.[\w.]+"
)
_UNKNOWN = ("Unrecognized arguments", "is not a known key", "does not accept option", "not accepted")


def _strings(tree: ast.AST):
    """(line, text) of every string literal that is not documentation; f-string placeholders become `{}`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            skip.add(id(node.value))  # docstrings and attribute docstrings
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def suggested_flags(text: str, default_command: str) -> list[tuple[str | None, str, bool]]:
    """(command or None for a foreign tool, flag, templated) for every `--flag` in a message."""
    found = []
    for match in _FLAG.finditer(text):
        command = default_command
        for ctx in _CONTEXT.finditer(text[: match.start() + 2]):  # + 2: the lookahead of `<command>: --`
            command = ctx.group("cmd") or ctx.group("short")
        found.append((command, "--" + match.group(1), bool(match.group(2))))
    return found


def collect() -> dict[tuple[str, str, bool], list[str]]:
    """{(command, flag, templated): [where]} over the whole package."""
    found: dict[tuple[str, str, bool], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, text in _strings(ast.parse(path.read_text())):
            if not re.search(r"\s", text.strip()):
                continue
            for command, flag, templated in suggested_flags(text, MODULE_COMMANDS.get(rel, "fit")):
                if command is not None:
                    found.setdefault((command, flag, templated), []).append(f"{rel}:{line}")
    return found


class _Parser(Exception):
    pass


@cache
def _trainer_parsers():
    """The `fit` parsers of both trainer CLIs, built without parsing anything."""
    from lightning_cqk.cli.glue import GlueCLI
    from lightning_cqk.cli.trainer import CQKCLI

    parsers = []
    for cls in (CQKCLI, GlueCLI):
        stop = type("ParserOnly", (cls,), {"parse_arguments": lambda self, parser, args: _raise(parser)})
        with pytest.raises(_Parser) as got:
            stop(args=["fit"])
        parsers.append(got.value.args[0])
    return parsers


def _raise(parser):
    raise _Parser(parser)


def _trainer_refused(command: str, flags: list[tuple[str, bool]]) -> set[tuple[str, bool]]:
    """The (flag, templated) pairs that neither trainer CLI accepts."""
    left = set(flags)
    parsers = _trainer_parsers()
    for parser in parsers:  # the parsers' own options first (instant)
        options = set(parser._subcommands_action._name_parser_map[command]._option_string_actions)
        left -= {(f, t) for f, t in left if f in options or (t and any(o.startswith(f + ".") for o in options))}
    for parser in parsers:  # subclass arguments (--data.*, logger init_args): real parses
        left -= {(f, False) for f in _parsed(parser, command, sorted(f for f, t in left if not t))}
    return left


def _parsed(parser, command: str, flags: list[str]) -> set[str]:
    """The flags the parser knows (given the value 1: a value it refuses still means a known flag).

    One parse for all; the flags an "Unrecognized arguments" error names are dropped and the rest parsed again; an
    unknown-key error that names none (a subclass's own) falls back to one parse per flag.
    """
    if not flags:
        return set()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args([command, *(x for f in flags for x in (f, "1"))])
        except SystemExit:
            pass
    text = err.getvalue()
    if not any(u in text for u in _UNKNOWN):
        return set(flags)
    named = re.search(r"Unrecognized arguments: (.*)", text)
    unknown = set(re.findall(r"--[\w.-]+", named.group(1))) & set(flags) if named else set()
    if unknown:
        return _parsed(parser, command, [f for f in flags if f not in unknown])
    if len(flags) == 1:
        return set()
    return {f for f in flags if _parsed(parser, command, [f])}


@cache
def _help_options(command: str) -> frozenset[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code in (0, None)
    return frozenset(re.findall(r"(?<![\w-])--[a-z][\w.-]*", out.getvalue()))


def refused(command: str, flags: list[tuple[str, bool]]) -> set[tuple[str, bool]]:
    """The (flag, templated) pairs of `flags` that `command` does not accept."""
    flags = [(f, t) for f, t in flags if f not in GLOBAL_FLAGS]
    if command in TRAINER_COMMANDS:
        return _trainer_refused(command, flags)
    options = _help_options(command)
    return {(f, t) for f, t in flags if not (f in options or (t and any(o.startswith(f + ".") for o in options)))}


def test_the_convention_reads_commands_and_skips_foreign_tools():
    text = "Use --data.bpe_file F (prepare: --bpe_file F), `lightning_cqk mc-eval --tokenizer x`; tensorboard --logdir"
    assert suggested_flags(text, "fit") == [
        ("fit", "--data.bpe_file", False),
        ("prepare", "--bpe_file", False),
        ("mc-eval", "--tokenizer", False),
        (None, "--logdir", False),
    ]
    assert suggested_flags("give --budget.{} 2e6", "fit") == [("fit", "--budget", True)]


def test_the_checker_refuses_a_flag_of_another_command():
    # the example: the offline-vocabulary error said --bpe_file; `fit` takes --data.bpe_file
    assert refused("fit", [("--bpe_file", False), ("--data.bpe_file", False), ("--data.bpe_filex", False)]) == {
        ("--bpe_file", False),
        ("--data.bpe_filex", False),
    }
    assert refused("prepare", [("--bpe_file", False)]) == set()
    assert refused("sweep", [("--config", False), ("--dry-run", False)]) == {("--config", False)}


def test_every_flag_a_message_suggests_is_accepted():
    found = collect()
    assert len(found) > 40, "the collector found too few suggestions: is the package where it should be?"
    by_command: dict[str, list[tuple[str, bool]]] = {}
    for command, flag, templated in found:
        by_command.setdefault(command, []).append((flag, templated))
    wrong = [
        f"{command} {flag}{'.<name>' if templated else ''} (suggested at {', '.join(found[command, flag, templated])})"
        for command, flags in sorted(by_command.items())
        for flag, templated in sorted(refused(command, flags))
    ]
    assert not wrong, "flags the messages suggest that the CLI refuses:\n" + "\n".join(wrong)
