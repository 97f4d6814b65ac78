"""Every training config the repo ships (configs/*.yaml, configs/papers/**): validation on optimizer-step boundaries,
a best checkpoint that never keeps a diverged model, and the instruments the studies read (issues 13, 14).

Lightning counts an integer `val_check_interval` in training batches, not optimizer steps: with gradient accumulation
a value meant as steps validated `accumulate_grad_batches` times too often (the 300M Q-K=V recipe: every step, on 10M
tokens), and a value that is not a multiple of it validates in the middle of an accumulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    p
    for p in [*(REPO / "configs").glob("*.yaml"), *(REPO / "configs" / "papers").glob("*/*.yaml")]
    if "callbacks" in (yaml.safe_load(p.read_text()).get("trainer") or {})
)
INSTRUMENTS = ("GradNormMonitor", "LossSpikeMonitor", "AttentionStats", "Throughput")
PAPER_CONFIGS = [p for p in CONFIGS if p.stem not in ("quickstart", "stability")]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_validation_falls_on_optimizer_steps_and_best_is_never_diverged(path: Path):
    trainer = yaml.safe_load(path.read_text())["trainer"]
    accumulate = trainer.get("accumulate_grad_batches") or 1
    assert trainer["val_check_interval"] % accumulate == 0, "validation would land inside an accumulation"
    classes = [cb["class_path"] for cb in trainer["callbacks"]]
    assert "lightning.pytorch.callbacks.ModelCheckpoint" not in classes, "use lightning_cqk.callbacks.BestCheckpoint"


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_paper_configs_carry_the_instruments(path: Path):
    classes = [cb["class_path"].rsplit(".", 1)[-1] for cb in yaml.safe_load(path.read_text())["trainer"]["callbacks"]]
    assert set(INSTRUMENTS) <= set(classes)
    # the monitors read the step's gradients before the non-finite guard acts on them
    assert classes.index("GradNormMonitor") < classes.index("NonFiniteGuard")
