"""What a run records about what it runs on and with, and what it needs: one module of version records.

**Device** (`describe_device`, `cpu_model`). The device a run computes on, in words: numbers agree to the last digit
only on the same kind of device. Runs are deterministic on one CPU type but not across types (issue 31: the corpus
study's `wikitext-standard-s1` gives val ppl 7.8167 on one CPU and 7.7688 from the same command, revision and
packages on another; they part in the 5th digit by step 49). So every run records what it ran on (`run.json`, per
attempt), the sweep keeps it per run, and a finished run is reused only on the same device (`study/run/runner.py`).

**Packages and code** (`package_versions`, `code_revision`). The versions of the packages a run uses, as recorded in
`run.json` (each attempt) and a sweep's status files. A study's numbers depend on more than the code: a torch,
Lightning, litdata, numpy, scipy or lm-eval release can change them without a commit here (requirements.lock pins the
versions the suite was run with). Each attempt of a run records `packages` (`package_versions()`: Python and every
direct dependency of pyproject.toml, the `eval` and `data` extras included; None for one not installed), and a sweep
resumed under other versions says which changed (`describe_difference`), as it does for code revisions: each attempt
records `revision` too (`code_revision`: the git commit of the checkout the package is imported from, `-dirty` with
uncommitted changes to tracked files).

**Requirements** (`require_torch`, `check_torch_features`). The torch version each shipped feature needs, checked when
a run is configured (before any step). pyproject.toml asks for torch>=2.9, which covers every feature below; an older
torch still gets installed on cluster images that pin it (or with --no-deps), and would fail late with an
AttributeError or TypeError. `check_torch_features` refuses at construction instead, naming the feature, the version
it needs and the one found.

Standard library only at import (torch is imported when a device is described or a version checked), so the run
directory's records and the light command line may use it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_cqk.errors import ConfigError

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig
    from lightning_cqk.optim import OptimConfig


# --------------------------------------------------------------------------------------------------------------- device
def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux, else `platform.processor()`), with the machine type."""
    name = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                name = line.split(":", 1)[1].strip()
                break
    name = name or platform.processor() or "unknown CPU"
    return f"cpu: {name} ({platform.machine()})"


def describe_device(device: Any = None) -> str:
    """`cpu: <model> (<arch>)` or `cuda: <GPU name>` for a torch device (None: the CPU)."""
    if device is not None and getattr(device, "type", str(device)) == "cuda":
        import torch

        index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
        return f"cuda: {torch.cuda.get_device_name(index)}"
    if device is not None and getattr(device, "type", "cpu") not in ("cpu", "cuda"):
        return f"{device.type}: {platform.machine()}"
    return cpu_model()


# ---------------------------------------------------------------------------------------------------- packages and code
# The distributions pyproject.toml depends on (dependencies, then the eval and data extras), by their PyPI names;
# tests/test_locked_environment.py checks that this list and pyproject.toml name the same packages.
DIRECT_DEPENDENCIES = (
    "torch",
    "lightning",
    "jsonargparse",
    "torchmetrics",
    "litdata",
    "tiktoken",
    "tensorboard",
    "numpy",
    "matplotlib",
    "scipy",
    "lm-eval",
    "datasets",
)


def package_versions() -> dict[str, str | None]:
    """{'python': ..., 'lightning-cqk': ..., '<dependency>': version or None when not installed}."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("lightning-cqk", *DIRECT_DEPENDENCIES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def differences(old: dict[str, str | None], new: dict[str, str | None]) -> dict[str, tuple[str | None, str | None]]:
    """{package: (old, new)} for every package whose version differs (a package only one side names is skipped:
    a record written before it was listed says nothing about it). `lightning-cqk` itself is left to the code
    revision."""
    return {k: (old[k], new[k]) for k in sorted(set(old) & set(new)) if k != "lightning-cqk" and old[k] != new[k]}


def describe_difference(old: dict[str, str | None], new: dict[str, str | None]) -> str:
    """'torch 2.12.0 -> 2.13.0, numpy 2.4.5 -> 2.4.6' ('not installed' for None)."""
    return ", ".join(
        f"{k} {a or 'not installed'} -> {b or 'not installed'}" for k, (a, b) in differences(old, new).items()
    )


def git_revision(cwd: str | Path | None = None) -> dict[str, Any]:
    """{'revision': HEAD commit or None, 'dirty': uncommitted changes to tracked files} of the code that runs.

    Default: the git checkout the imported `lightning_cqk` package is tracked in (the sweep may be started from any
    directory); an installed package (no checkout tracks it, e.g. a wheel in a virtualenv that lies inside some other
    repository) gives None for both, and `_versions` records the installed version instead.
    """
    try:
        if cwd is None:
            import lightning_cqk

            cwd = Path(lightning_cqk.__file__).resolve().parent
            tracked = ["git", "ls-files", "--error-unmatch", "__init__.py"]
            if subprocess.run(tracked, cwd=cwd, capture_output=True, text=True).returncode != 0:
                return {"revision": None, "dirty": None}
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        diff = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=cwd, capture_output=True, text=True)
        return {"revision": rev.stdout.strip(), "dirty": bool(diff.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"revision": None, "dirty": None}


def code_revision() -> str:
    """The code this process runs, in one string: the commit, `-dirty` when tracked files have uncommitted changes,
    `unknown` outside a git checkout (an installed package: its version is in `packages`)."""
    git = git_revision()
    revision = git.get("revision")
    return "unknown" if not revision else revision + ("-dirty" if git.get("dirty") else "")


# --------------------------------------------------------------------------------------------------------- requirements
#: feature -> (the first torch release that has it, what it is in torch)
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "muon": ((2, 9), "torch.optim.Muon (model.optim.name: muon)"),
    "gqa": ((2, 5), "scaled_dot_product_attention(enable_gqa=...) (grouped K/V heads: n_kv_groups < n_head)"),
    "fsdp2": ((2, 6), "torch.distributed.fsdp.fully_shard (FSDP2, ModelParallelStrategy)"),
    "framework": ((2, 9), "the framework as tested (pyproject.toml: torch>=2.9)"),
}


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch ("2.13.0+cpu" -> (2, 13))."""
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def require_torch(feature: str) -> None:
    """Raise ConfigError when the installed torch is older than `feature` needs (see FEATURES)."""
    import torch

    needed, what = FEATURES[feature]
    found = torch_version()
    if found < needed:
        raise ConfigError(
            f"{what} needs torch>={needed[0]}.{needed[1]}, but torch {torch.__version__} is installed. Install a newer "
            f"torch (pip install 'torch>={needed[0]}.{needed[1]}'), or turn the feature off."
        )


def uses_grouped_heads(config: ModelConfig) -> bool:
    """True when some layer has fewer K/V heads than query heads (SDPA's enable_gqa)."""
    overrides = [o if isinstance(o, dict) else vars(o) for o in config.layer_overrides]
    specs = [config.attention_options, *(o.get("attention_options") for o in overrides)]
    return any(isinstance(s, dict) and s.get("n_kv_groups") not in (None, config.n_head) for s in specs)


def check_torch_features(config: ModelConfig, optim: OptimConfig) -> None:
    """Refuse, at configuration, a feature the installed torch lacks (Muon, grouped K/V heads)."""
    if optim.name == "muon":
        require_torch("muon")
    if uses_grouped_heads(config):
        require_torch("gqa")
