"""The shape of the house, checked over `ast`: data flows one way, and imports follow it.

Every import of the package (module level, inside functions and under `TYPE_CHECKING` alike: a lazy import is
still a dependency) is read from the source, without importing anything. Each file belongs to a *unit* (a
sub-package such as `attention/`, or a top-level module such as `run/directory.py`), and each unit to a layer, lowest
first, in the order data flows from settings to the command line (docs/layout.md):

    0  errors, model_config, environment,     names and numbers; the user-error classes; every LIGHTNING_CQK_*
       files                                    variable; files (atomic writes, strict YAML, shipped configs),
                                                standard library only at import
    1  checkpoint                               checkpoint files: intact? trusted? loaded weights_only; FSDP2
                                                folders; consolidate (standard library only at import)
    2  attention                                the backends (torch only)
    3  model                                    GPT, blocks, decode cache, analytic FLOPs (torch only)
    4  optim                                    optimizers, parameter groups, schedules, QK-clip
    5  data                                     tokenizers, corpora, shards, the streaming DataModule
    6  run                                      a run before its first step: run directories (names, records,
                                                resumes), the lock, launch ranks, the memory check, version records
    7  module                                   the LightningModule
    8  callbacks                                instruments and checkpoints, writing beside the run
    9  inference, evaluation, downstream        what reads a trained checkpoint (inference/pretrained.py loads it)
    10 contract, study                          the contract checks (check-backend) and the backend table, studies
                                                and their reports (inside study/: design < judge < report; run/ imports
                                                design/ and the results model only)
    11 cli                                      the command line: every command enters here
    -  lightning_cqk/__init__.py, __main__.py   the package's doors (not counted)

An import from a lower layer to a higher one is an *upward arrow*; two units that import each other (directly or
through others) form an *import circle*. The targets (issue 26): one circle, the deliberate model_config <-> attention
(a ModelConfig validates its attention settings against the registry, and every backend is built from a
ModelConfig), at most two upward arrows, each listed below with its reason, and no private name (`_x`) imported
from another module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_cqk"
NAME = "lightning_cqk"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "model_config", "environment", "files"),
    ("checkpoint",),
    ("attention",),
    ("model",),
    ("optim",),
    ("data",),
    ("run",),
    ("module",),
    ("callbacks",),
    ("inference", "evaluation", "downstream"),
    ("contract", "study"),
    ("cli",),
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
DOORS = ("__init__", "__main__")

#: The one deliberate circle.
ALLOWED_CIRCLES = [{"model_config", "attention"}]

#: The upward arrows allowed, (from, to): why each stays.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("model_config", "attention"): "ModelConfig.__post_init__ validates the attention name and options against the "
    "registry (and resolves a hybrid layer pattern): the deliberate circle's upward half.",
    ("attention", "data"): "fixed_seq_qk (attention/backends/deconstructed_qk.py) reads its fixed token stream from a "
    "token file or the built-in corpus (data/token_ids.py) when such a model is built: the one backend whose buffers "
    "come from data; imported then, so model code still imports only torch.",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _unit(module: str) -> str:
    """`lightning_cqk.attention.base` -> `attention`; `lightning_cqk.run.lock` -> `run`; the package -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def read_imports() -> dict[str, list[tuple[str, list[str], int]]]:
    """{module: [(imported module, names imported from it, line)]} for every import of a package module."""
    out: dict[str, list[tuple[str, list[str], int]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == NAME or alias.name.startswith(NAME + "."):
                        found.append((alias.name, [], node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, path.name == "__init__.py", node)
                if target != NAME and not target.startswith(NAME + "."):
                    continue
                names = []
                for alias in node.names:  # `from lightning_cqk import attention`: a sub-module, not a name
                    if _is_module(f"{target}.{alias.name}"):
                        found.append((f"{target}.{alias.name}", [], node.lineno))
                    else:
                        names.append(alias.name)
                if names:
                    found.append((target, names, node.lineno))
        out[module] = found
    return out


def unit_edges(imports: dict[str, list[tuple[str, list[str], int]]]) -> dict[tuple[str, str], list[str]]:
    """{(from unit, to unit): ["module:line -> module", ...]} between different units (doors left out)."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, found in imports.items():
        a = _unit(module)
        for target, _, line in found:
            b = _unit(target)
            if a != b and a not in DOORS and b not in DOORS:
                edges[(a, b)].append(f"{module}:{line} -> {target}")
    return dict(edges)


def circles(edges) -> list[set[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(set(graph) | {b for _, b in edges}):
        if v not in index:
            visit(v)
    return found


def upward_arrows(edges) -> dict[tuple[str, str], list[str]]:
    return {(a, b): where for (a, b), where in edges.items() if LAYER[b] > LAYER[a]}


def private_imports(imports) -> list[str]:
    """`from lightning_cqk.x import _y` in a module other than x (dunders such as __version__ aside)."""
    bad = []
    for module, found in imports.items():
        for target, names, line in found:
            for name in names:
                if name.startswith("_") and not name.startswith("__") and target != module:
                    bad.append(f"{module}:{line} imports {name} from {target}")
    return bad


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in read_imports()} - set(DOORS)
    assert units <= set(LAYER), f"units without a layer (add them to LAYERS): {sorted(units - set(LAYER))}"


def test_one_circle_the_deliberate_one():
    found = circles(unit_edges(read_imports()))
    assert found == ALLOWED_CIRCLES, f"import circles: {found}; allowed: {ALLOWED_CIRCLES}"


def test_at_most_two_upward_arrows_each_with_its_reason():
    up = upward_arrows(unit_edges(read_imports()))
    unexplained = {k: v for k, v in up.items() if k not in ALLOWED_UPWARD}
    assert not unexplained, "upward imports (from a lower layer to a higher one; move the code down, or the " + (
        f"import up): {unexplained}"
    )
    assert len(up) <= 2


def test_no_private_name_imported_across_modules():
    assert private_imports(read_imports()) == []


#: Inside study/: the stages each may import (itself included). design < judge < report; run/ reads only the design
#: and the results model; report may ask run/ (whose lock is live, a run's scalars). `__init__` files are doors.
STUDY = f"{NAME}.study"
STAGE_MAY_IMPORT: dict[str, set[str]] = {
    "design": {"design", "results_model"},
    "judge": {"design", "judge", "results_model"},
    "report": {"design", "judge", "report", "run", "results_model"},
    "run": {"design", "run", "results_model"},
    "results_model": set(),
}
#: The results model run/ may read besides results_model.py, with its reason.
RUN_READS_RESULTS: dict[str, str] = {
    f"{STUDY}.report.results": "adoption (run/adopt.py) reads a committed twin's study.json and runs.csv through the "
    "committed results' one checked reader, read_committed",
}


def _stage(module: str) -> str | None:
    """`lightning_cqk.study.judge.stats` -> judge; `lightning_cqk.study.results_model` -> results_model; the
    package door (`lightning_cqk.study`) and modules outside study/ -> None."""
    parts = module.split(".")
    if parts[:2] != [NAME, "study"] or len(parts) < 3:
        return None
    return parts[2]


def stage_violations(imports) -> list[str]:
    bad = []
    for module, found in imports.items():
        a = _stage(module)
        if a is None or module.endswith(".__init__") or module == f"{STUDY}.{a}":
            continue
        for target, _, line in found:
            b = _stage(target)
            if b is None or b in STAGE_MAY_IMPORT[a] or (a == "run" and target in RUN_READS_RESULTS):
                continue
            bad.append(f"{module}:{line} ({a}) imports {target} ({b})")
    return bad


def test_study_stages_import_in_order():
    """design < judge < report, and run/ imports only design/ and the results model."""
    stages = {_stage(m) for m in read_imports()} - {None}
    assert stages == set(STAGE_MAY_IMPORT), f"study/ stages without a rule: {stages - set(STAGE_MAY_IMPORT)}"
    assert stage_violations(read_imports()) == []


def test_the_stage_check_sees_a_backward_import():
    fake = {
        f"{STUDY}.design.spec": [(f"{STUDY}.judge.stats", ["ALPHA"], 3)],
        f"{STUDY}.run.runner": [(f"{STUDY}.report.report_command", ["write_report"], 9)],
        f"{STUDY}.judge.verdict": [(f"{STUDY}.design.claim", ["Claim"], 1)],
    }
    assert stage_violations(fake) == [
        f"{STUDY}.design.spec:3 (design) imports {STUDY}.judge.stats (judge)",
        f"{STUDY}.run.runner:9 (run) imports {STUDY}.report.report_command (report)",
    ]


def test_no_two_modules_share_a_name_in_study():
    """A module's name says what it is: none repeats another's anywhere in the package (issue 43)."""
    names = [p.stem for p in (PACKAGE / "study").rglob("*.py") if p.stem != "__init__"]
    others = {p.stem for p in PACKAGE.rglob("*.py") if "study" not in p.relative_to(PACKAGE).parts[:1]}
    assert sorted({n for n in names if names.count(n) > 1 or n in others}) == []


def test_the_checker_sees_what_it_should(tmp_path):
    """The checks can fail: a circle, an upward arrow and a private import are found when present."""
    edges = {("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}
    assert circles(edges) == [{"a", "b", "c"}]
    imports = read_imports()
    edges = unit_edges(imports)
    assert ("model", "attention") in edges and ("cli", "run") in edges
    fake = {"lightning_cqk.model.gpt": [("lightning_cqk.cli.trainer", ["_private"], 1)]}
    assert private_imports(fake) and upward_arrows(unit_edges(fake)) == {("model", "cli"): [fake_line(fake)]}


def fake_line(fake) -> str:
    ((module, [(target, _, line)]),) = fake.items()
    return f"{module}:{line} -> {target}"


if __name__ == "__main__":  # python tests/test_import_graph.py: the graph's numbers
    imports = read_imports()
    edges = unit_edges(imports)
    print("circles:", circles(edges))
    for (a, b), where in sorted(upward_arrows(edges).items()):
        print(f"upward {a} -> {b}: {where}")
    for line in private_imports(imports):
        print("private:", line)
