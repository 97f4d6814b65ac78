"""What a study run *is*: one identity, the same code, data and settings computing it (issue 43).

Two runs give the same numbers to the last digit only when the same code trains the same model on the same data
with the same settings, packages, device, precision and thread count (training is deterministic; the thread count
changes the 7th digit of a validation loss). A run's identity is the full sha256 of all of it, kept as `parts`, so
that what changed can be said by name:

- `settings`: the sha256 of the configuration as `lightning_cqk fit`'s own parser resolves it (cli/resolve.py: the
  config files in order, the overrides, every code default; `init_args` levels dropped, so two spellings of one
  setting are one key) and the seed; left out are what only says where a run writes or how its console looks
  (`INERT_KEYS`) and the paths of its data (`DATA_PATH_KEYS`: the data are in `data`, by content). A value that
  names another run of the same sweep (`budget.match_to`) is replaced by that run's identity.
- `code`: the git revision of the checkout `lightning_cqk` is imported from, each uncommitted change (tracked or
  untracked, `.gitignore` respected) to a source file (`SOURCE_SUFFIXES`) by its sha256, and every module the run
  imports from outside the package and its libraries (a class_path's top-level module, the packages of
  `$LIGHTNING_CQK_TRUSTED_MODULES`: the researcher's callbacks and plugin backends) by the sha256 of its source, or
  by its distribution's version when it is installed. Outside a checkout: the package's own source files' sha256.
- `data`: each data folder's content fingerprint (`data_fingerprint`: the bytes of every token chunk, the indexes'
  settings and the manifest without its paths and times), and the tokenizer file's sha256; "not prepared" before
  the first run of a folder made its shards.
- `packages` (run/version_records.py), `device` and `precision` (the device the run computes with, as a run records it),
  `threads` (OMP_NUM_THREADS as the runner gives it to the run, else torch's default).

The identity is recorded in each run's status file (`identity`, `identity_parts`, and the resolved settings
themselves, `resolved_settings`), in run.json, and in the committed study.json and runs.csv. A finished run counts
as done only when its recorded identity equals the one computed now (study/run/ledger.py); a sibling sweep's run is
reused only with an equal identity; a committed twin is adopted by its recorded identity, never one rebuilt from
today's files (study/run/adopt.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

IDENTITY_VERSION = 2
# Keys that change where a run writes, what its console shows or how a command is checked, never what it computes.
INERT_KEYS = (
    "trainer.logger",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "ckpt_path",
    "on_unfinished",
    "memory_check",
    "trainer.precision",  # in `precision`, resolved (null: bf16-mixed on a bf16 GPU, else fp32)
)
# Where a run's data are: the data themselves are in the identity's `data` part, by content.
DATA_PATH_KEYS = ("data_dir", "cache_dir", "bpe_file", "source", "val_source")
SOURCE_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".so",
                   ".yaml", ".yml", ".toml", ".cfg")  # fmt: skip
PARTS = ("settings", "code", "data", "packages", "device", "precision", "threads")


def canonical_key(key: str) -> str:
    """A dotted key as the parser resolves it, `init_args` levels dropped (`data.init_args.seq_len`: `data.seq_len`)."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{canonical dotted key: leaf value} of a YAML tree; lists and `class_path` stay values of their key."""
    if not isinstance(tree, Mapping) or not tree:
        return {canonical_key(prefix): tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, path))
    return out


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def is_data_path(key: str) -> bool:
    return key.startswith("data.") and key.rsplit(".", 1)[-1] in DATA_PATH_KEYS


def comparable_settings(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`flat` without the inert keys and data paths (what `settings_digest` hashes)."""
    out = dict(flat)
    for key in list(out):
        if any(key == k or key.startswith(k + ".") for k in INERT_KEYS) or is_data_path(key):
            del out[key]
    return out


def settings_digest(settings: Mapping[str, Any]) -> str:
    """The `settings` part of an identity: sha256 of the resolved settings (the seed among them)."""
    return _digest({"version": IDENTITY_VERSION, "settings": dict(settings)})


@dataclasses.dataclass(frozen=True)
class Identity:
    """A run's identity: its parts (module docstring) and their full sha256 (`digest`)."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        return identity_digest(self.parts)

    def what(self) -> str:
        """sha256 of what the run computes (settings and data) without how (code, packages, device, threads): the
        key a committed twin is found by, its `how` vouched for by its arm's probe (study/run/adopt.py)."""
        return _digest({"settings": self.parts.get("settings"), "data": self.parts.get("data")})


def identity_digest(parts: Mapping[str, Any]) -> str:
    return _digest({"version": IDENTITY_VERSION, **{k: parts.get(k) for k in PARTS}})


def how_of(parts: Mapping[str, Any]) -> dict[str, Any]:
    """The parts that say how a run was computed (code, packages, device, precision, threads)."""
    return {k: parts.get(k) for k in ("code", "packages", "device", "precision", "threads")}


def changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between two identities' parts, in words ("code: lightning_cqk/model/gpt.py changed")."""
    if not old:
        return ["no identity recorded (computed before identities were recorded, or by hand)"]
    out: list[str] = []
    if old.get("settings") != new.get("settings"):
        out.append("settings: the resolved configuration differs (a config file, an override or a code default)")
    a, b = old.get("code") or {}, new.get("code") or {}
    if a != b:
        if a.get("revision") != b.get("revision"):
            out.append(f"code: revision {str(a.get('revision'))[:12]} -> {str(b.get('revision'))[:12]}")
        files_a, files_b = a.get("files") or {}, b.get("files") or {}
        for path in sorted(set(files_a) | set(files_b)):
            if files_a.get(path) != files_b.get(path):
                out.append(f"code: {path} changed since")
        mods_a, mods_b = a.get("modules") or {}, b.get("modules") or {}
        for name in sorted(set(mods_a) | set(mods_b)):
            if mods_a.get(name) != mods_b.get(name):
                out.append(f"code: module {name} changed since ({mods_a.get(name)} -> {mods_b.get(name)})")
        if len(out) == (old.get("settings") != new.get("settings")):
            out.append("code: the package's source differs")
    da, db = old.get("data") or {}, new.get("data") or {}
    for key in sorted(set(da) | set(db)):
        if da.get(key) != db.get(key):
            out.append(f"data: {key} differs ({'re-prepared or replaced' if da.get(key) else 'not recorded'})")
    if old.get("packages") != new.get("packages"):
        from lightning_cqk.run.version_records import describe_difference

        out.append(f"packages: {describe_difference(old.get('packages') or {}, new.get('packages') or {}) or 'differ'}")
    for key in ("device", "precision", "threads"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {old.get(key)} -> {new.get(key)}")
    return out or ["identity format"]


# ----------------------------------------------------------------------------------------------------------- code
def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def _file_sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _tree_sha(root: Path) -> str:
    """sha256 of every source file under `root` (relative paths and contents), caches left out."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts:
            h.update(f"{path.relative_to(root)}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=4)
def checkout_code(package: Path | None = None) -> dict[str, Any]:
    """{'revision', 'files'}: the commit of the checkout `package` (default: lightning_cqk) is tracked in, and each
    uncommitted change to a source file (tracked or untracked) by sha256; outside a checkout, the installed
    package's version and its source's sha256. Computed once per process (a sweep's code is its start's)."""
    if package is None:
        import lightning_cqk

        package = Path(lightning_cqk.__file__).resolve().parent
    top = _git(["rev-parse", "--show-toplevel"], package)
    tracked = _git(["ls-files", "--error-unmatch", "__init__.py"], package) is not None
    if top is None or not tracked:
        from lightning_cqk.run.version_records import package_versions

        return {"revision": f"lightning-cqk {package_versions().get('lightning-cqk')}",
                "files": {f"{package.name}/": _tree_sha(package)}}  # fmt: skip
    root = Path(top.strip())
    revision = (_git(["rev-parse", "HEAD"], root) or "unknown").strip()
    status = _git(["status", "--porcelain", "-uall", "-z"], root) or ""
    files: dict[str, str] = {}
    entries = status.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if code[0] in "RC":  # a rename: the old path follows
            i += 1
        if Path(path).suffix in SOURCE_SUFFIXES:
            files[path] = _file_sha(root / path) if "D" not in code else "deleted"
    return {"revision": revision, "files": files}


def _installed_roots() -> list[Path]:
    import site
    import sysconfig

    roots = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    return [Path(r).resolve() for r in roots if r]


def module_source(name: str) -> str:
    """A top-level module's source, as an identity part: `sha256:<hex>` of its file (or of every source file of its
    package), `<distribution> <version>` for an installed one, `builtin`, or `not found`. Nothing is imported."""
    from importlib import machinery, metadata

    search = [*sys.path, *os.environ.get("PYTHONPATH", "").split(os.pathsep), os.getcwd()]
    spec = machinery.PathFinder.find_spec(name, [p or os.getcwd() for p in search if p is not None])
    if spec is None:
        return "builtin" if name in sys.builtin_module_names else "not found"
    origin = Path(spec.origin).resolve() if spec.origin and spec.origin not in ("built-in", "frozen") else None
    locations = [Path(p).resolve() for p in (spec.submodule_search_locations or [])]
    where = locations[0] if locations else origin
    if where is None:
        return "builtin"
    if any(where.is_relative_to(root) for root in _installed_roots()):
        dists = metadata.packages_distributions().get(name) or []
        versions = sorted({f"{d} {metadata.version(d)}" for d in dists})
        return ", ".join(versions) or f"installed at {where}"
    return "sha256:" + (_tree_sha(where) if where.is_dir() else _file_sha(where))


def outside_modules(settings: Mapping[str, Any]) -> dict[str, str]:
    """{top-level module: its source (`module_source`)} for every module a run imports from outside this package
    and its libraries: the roots of the class paths in its settings, and `$LIGHTNING_CQK_TRUSTED_MODULES`."""
    from lightning_cqk.study.design.settings import trusted_modules

    names = set(trusted_modules())
    paths = [v for k, v in settings.items() if k.endswith("class_path") and isinstance(v, str)]
    for value in paths + _class_paths(list(settings.values())):
        names.add(value.split(".", 1)[0])
    return {name: module_source(name) for name in sorted(names - {"lightning_cqk"})}  # the package: its checkout


def _class_paths(values: list[Any]) -> list[str]:
    out: list[str] = []
    for value in values:
        if isinstance(value, Mapping):
            if isinstance(value.get("class_path"), str):
                out.append(value["class_path"])
            out += _class_paths(list(value.values()))
        elif isinstance(value, list):
            out += _class_paths(value)
    return out


def code_part(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {**checkout_code(), "modules": outside_modules(settings)}


# ----------------------------------------------------------------------------------------------------------- data
def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lightning_cqk" / "data-fingerprints.json"


def data_fingerprint(data_dir: str | Path) -> str:
    """A prepared shard folder's content fingerprint: sha256 of its manifest (without paths and times), each split's
    index settings and every chunk's bytes; "not prepared" without a manifest. Cached (a file in
    ~/.cache/lightning_cqk) by the folder's file fingerprint (inode, size and mtime of every file:
    `integrity.shard_fingerprint`), so an unchanged folder is not read again and a rewritten one always is."""
    from lightning_cqk.data import remote
    from lightning_cqk.data.integrity import shard_fingerprint

    if remote.is_remote(data_dir):
        return f"remote {data_dir}"  # cannot be read cheaply: its path stands for it
    root = Path(data_dir)
    if not (root / "manifest.json").is_file():
        return "not prepared"
    stamp = shard_fingerprint(root)["files"]
    cache = _cache_file()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if stamp in known:
        return known[stamp]
    h = hashlib.sha256()
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    volatile = ("created", "seconds", "litdata_version", "extra", "sources", "val_sources", "files", "left_out")
    h.update(json.dumps({k: v for k, v in manifest.items() if k not in volatile}, sort_keys=True).encode())
    for split in ("train", "val"):
        try:
            index = json.loads((root / split / "index.json").read_text())
        except (OSError, ValueError):
            h.update(f"{split}: no index;".encode())
            continue
        h.update(json.dumps(index.get("config"), sort_keys=True).encode())
        for chunk in index.get("chunks", []):
            name = str(chunk.get("filename"))
            h.update(f"{split}/{name}:{_file_sha(root / split / name)};".encode())
    fingerprint = h.hexdigest()
    known[stamp] = fingerprint
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        from lightning_cqk.files.atomic import write_json_atomically

        write_json_atomically(cache, known)
    except OSError:
        pass  # a cache that cannot be written costs a read next time, nothing else
    return fingerprint


def tokenizer_source(name: Any, bpe_file: Any) -> str:
    """The tokenizer a run loads, by content: the vocabulary file's sha256 (`data.bpe_file`, else
    $LIGHTNING_CQK_GPT2_BPE for gpt2), or its name where it has no file."""
    if str(name) == "gpt2":
        from lightning_cqk.data.tokenizers import GPT2_BPE_ENV

        bpe_file = bpe_file or os.environ.get(GPT2_BPE_ENV)
    if bpe_file:
        return f"{name} sha256:{_file_sha(Path(str(bpe_file)))}"
    return str(name)


def data_part(flat: Mapping[str, Any]) -> dict[str, str]:
    """{"shards" (or "shards <key>" for a data module of several folders): fingerprint, "tokenizer": its source}."""
    dirs = sorted((k, v) for k, v in flat.items() if k.startswith("data.") and k.endswith("data_dir") and v)
    out: dict[str, str] = {}
    for key, value in dirs:
        label = "shards" if key == "data.data_dir" else f"shards {key[len('data.') :]}"
        out[label] = data_fingerprint(str(value))
    if "data.tokenizer" in flat:
        out["tokenizer"] = tokenizer_source(flat.get("data.tokenizer"), flat.get("data.bpe_file"))
    return out


def data_dirs(flat: Mapping[str, Any]) -> dict[str, str]:
    """{data part label: the folder} (what `changes` names)."""
    return {
        ("shards" if k == "data.data_dir" else f"shards {k[len('data.') :]}"): str(v)
        for k, v in flat.items()
        if k.startswith("data.") and k.endswith("data_dir") and v
    }


# ---------------------------------------------------------------------------------------------- device, threads
@functools.lru_cache(maxsize=1)
def _probe() -> tuple[str, bool, int]:
    """(the CUDA device a run would compute on, or "", whether it supports bf16, torch's default thread count), as a
    fresh process of this environment sees them: asked in a child, so this process never initializes CUDA and its
    own torch settings (a test's set_num_threads) do not count."""
    code = (
        "import torch\nfrom lightning_cqk.run.version_records import describe_device\n"
        "gpu = torch.cuda.is_available()\n"
        "print(describe_device(torch.device('cuda')) if gpu else '', gpu and torch.cuda.is_bf16_supported(), "
        "torch.get_num_threads(), sep='|')\n"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    found = probe.stdout.strip().rsplit("|", 2)
    if len(found) != 3:
        raise RuntimeError(f"could not ask torch for the device and threads a run gets: {probe.stderr.strip()[-300:]}")
    return found[0], found[1] == "True", int(found[2])


def device_of(accelerator: str, precision: str | None) -> tuple[str, str]:
    """(device, precision) a run with `trainer.accelerator` and `trainer.precision` computes with, as its run.json
    records them (device_info.describe_device; precision null: the CLI's auto_precision)."""
    from lightning_cqk.run.version_records import cpu_model

    device = cpu_model()
    if str(accelerator or "auto").lower() in ("auto", "gpu", "cuda"):
        gpu, bf16, _ = _probe()
        if gpu:
            device = gpu
            if precision is None:
                precision = "bf16-mixed" if bf16 else "32-true"
    return device, str(precision if precision is not None else "32-true")


def run_threads(threads: int | None) -> int:
    """The intra-op thread count a run computes with: OMP_NUM_THREADS of this environment, else the runner's
    (`threads`: cores / jobs with --jobs > 1), else torch's default in a fresh process here (`_probe`)."""
    given = os.environ.get("OMP_NUM_THREADS")
    if given and given.strip().isdigit() and int(given) > 0:
        return int(given)
    if threads is not None:
        return int(threads)
    return _probe()[2]


# ------------------------------------------------------------------------------------------------------ identity
def identity_of(flat: Mapping[str, Any], threads: int | None) -> tuple[Identity, dict[str, Any]]:
    """(the identity, the settings it hashes) of a run whose resolved settings (flattened, seed included) are `flat`."""
    from lightning_cqk.run.version_records import package_versions

    settings = comparable_settings(flat)
    device, precision = device_of(str(flat.get("trainer.accelerator") or "auto"), flat.get("trainer.precision"))
    parts = {
        "settings": settings_digest(settings),
        "code": code_part(flat),
        "data": data_part(flat),
        "packages": package_versions(),
        "device": device,
        "precision": precision,
        "threads": run_threads(threads),
    }
    return Identity(parts), settings


def resolved_flat(configs: list[str], overrides: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """{canonical dotted key: value}: the run's configuration as `lightning_cqk fit` resolves it (cli/resolve.py),
    flattened, all keys kept. The seed is set as the run sets it (`--seed_everything`, after every override), so
    the runs of one point of the grid are parsed once. Raises ConfigUnresolvable."""
    from lightning_cqk.study.design.settings import resolved_config

    flat = flatten(resolved_config(configs, overrides))
    flat["seed_everything"] = int(seed)
    return flat


def settings_of(configs: list[str], overrides: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The settings an identity hashes (`comparable_settings` of `resolved_flat`)."""
    return comparable_settings(resolved_flat(configs, overrides, seed))


def same_value(a: Any, b: Any) -> bool:
    """Whether an override's value and a resolved setting are one value (numbers by value: 1e-3 and 0.001)."""
    if a == b:
        return True
    try:
        return float(a) == float(b) and not isinstance(a, bool) and not isinstance(b, bool)
    except (TypeError, ValueError):
        return str(a) == str(b)


def replace_run_paths(overrides: Mapping[str, Any], sweep_dir: Path, identities: Mapping[str, str]) -> dict[str, Any]:
    """Overrides with every value that names a run directory of this sweep replaced by `run:<that run's identity>`."""
    prefix = str(sweep_dir).rstrip("/") + "/"
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, str) and value.startswith(prefix):
            name = value[len(prefix) :].split("/", 1)[0]
            if name in identities:
                value = f"run:{identities[name]}"
        out[key] = value
    return out


def result_dir(sweep_dir: str | Path, name: str) -> Path:
    """Where the numbers of run `name` of a sweep are: its own directory, or, for a run the runner did not compute
    again, the run it shares (its status file's `same_as`: a run of this sweep; `reused_from`: a sibling sweep's)."""
    sweep_dir = Path(sweep_dir)
    status_file = sweep_dir / "status" / f"{name}.json"
    try:
        status = json.loads(status_file.read_text()) if status_file.is_file() else {}
    except ValueError:
        status = {}
    if status.get("same_as"):
        return sweep_dir / str(status["same_as"])
    if status.get("reused_from"):
        return Path(status["reused_from"])
    return sweep_dir / name
