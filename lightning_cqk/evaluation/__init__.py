"""Evaluation of trained checkpoints with EleutherAI's lm-evaluation-harness (`lightning_cqk eval`).

scoring   log-likelihood of token continuations, batched (torch only; `mc-eval` scores with it too)
lm        `CQKLM`, the lm-eval model class registered as "lightning_cqk" (needs the `eval` extra)
command   `lightning_cqk eval --checkpoint CKPT --tasks ...` through `lm_eval.simple_evaluate`
task_files  the `--include_path` task YAML files, read first: one lm-eval cannot read is named, not skipped

Only ``lm`` and ``command`` import ``lm_eval``, the optional dependency: ``pip install -e '.[eval]'``.
Conventions and local tasks: docs/evaluation.md.
"""

LM_EVAL_MISSING = (
    "lm-evaluation-harness is not installed; it is the optional `eval` extra: pip install -e '.[eval]' "
    "(or pip install 'lm_eval>=0.4.9,<0.5')."
)
