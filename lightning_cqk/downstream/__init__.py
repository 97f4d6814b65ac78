"""Downstream evaluation of pretrained checkpoints: GLUE fine-tuning and zero/few-shot multiple-choice scoring.

glue_tasks       the nine GLUE tasks and their readers (official TSV layout, original releases, Hugging Face)
glue_data        GlueDataModule: a task tokenised with the checkpoint's tokenizer
pretrained       rebuild a LitLM checkpoint's GPT (any backend) with its training tokenizer
classifier       GlueClassifier: pooling + head + the official metrics
glue_metrics     the official metric of each task (torchmetrics) and the task score
glue_table       glue.json / glue.md of a checkpoint, and several checkpoints side by side
run_glue         `lightning_cqk glue`: every task x a fixed seed set -> the table
multiple_choice  `lightning_cqk mc-eval`: log-likelihood scoring of jsonl multiple-choice tasks (lm-eval tasks:
                 `lightning_cqk eval`, lightning_cqk.evaluation)
cli              GlueCLI, the LightningCLI that `lightning_cqk fit` uses for downstream configs
"""

from lightning_cqk.downstream.classifier import GlueClassifier
from lightning_cqk.downstream.glue_data import GlueDataModule
from lightning_cqk.downstream.glue_tasks import GLUE_TASKS, get_task, load_task
from lightning_cqk.downstream.pretrained import load_pretrained

__all__ = ["GLUE_TASKS", "GlueClassifier", "GlueDataModule", "get_task", "load_pretrained", "load_task"]
