"""Downstream evaluation of pretrained checkpoints: GLUE fine-tuning and zero/few-shot multiple-choice scoring.

glue_tasks       the nine GLUE tasks and their readers (official TSV layout, original releases, Hugging Face)
glue_data        GlueDataModule: a task tokenised with the checkpoint's tokenizer
classifier       GlueClassifier: pooling + head + the official metrics
glue_metrics     the official metric of each task (torchmetrics) and the task score
glue_table       glue.json / glue.md of a checkpoint, and several checkpoints side by side
multiple_choice  `lightning_cqk mc-eval`: log-likelihood scoring of jsonl multiple-choice tasks (lm-eval tasks:
                 `lightning_cqk eval`, lightning_cqk.evaluation)

The checkpoint a task starts from is loaded by `lightning_cqk.inference.pretrained`; the commands (`lightning_cqk
glue`, `fit` with a GLUE config through GlueCLI) live in `lightning_cqk.cli` (glue.py, glue_command.py).
"""

from lightning_cqk.downstream.classifier import GlueClassifier
from lightning_cqk.downstream.glue_data import GlueDataModule
from lightning_cqk.downstream.glue_tasks import GLUE_TASKS, get_task, load_task

__all__ = ["GLUE_TASKS", "GlueClassifier", "GlueDataModule", "get_task", "load_task"]
