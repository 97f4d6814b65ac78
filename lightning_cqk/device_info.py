"""The device a run computes on, in words: numbers agree to the last digit only on the same kind of device.

Runs are deterministic on one CPU type but not across types (issue 31: the corpus study's `wikitext-standard-s1`
gives val ppl 7.8167 on one CPU and 7.7688 from the same command, revision and packages on another; they part in the
5th digit by step 49). So every run records what it ran on (`run.json`, per attempt), the sweep keeps it per run,
and a finished run is reused only on the same device (`study/run/runner.py`).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any


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
