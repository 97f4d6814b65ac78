"""The `lightning_cqk` command line: one wing, one file a job.

    main.py      the entry point: dispatch to a subcommand (imports neither torch nor Lightning: --help is instant)
    trainer.py   CQKCLI, the LightningCLI of fit / validate / test / predict: Lightning's hooks, the run's preflight
                 (run/preflight.py) called once
    checkpoint_settings.py  a checkpoint's model settings as the parser's defaults (--ckpt_path)
    glue.py      GlueCLI, the LightningCLI of GLUE fine-tuning: `glue fit|validate|test` (and `fit` of a GLUE config)
    glue_command.py  `glue` (every GLUE task x seeds through GlueCLI -> glue.json / glue.md) and `glue-table`
    error_report.py  user errors print alone (`--debug` for the traceback)
    hints.py     did-you-mean for unknown config keys
    presets.py   size presets and the shape fields set against them
    strategy.py  FSDP2Strategy, what `--trainer.strategy ModelParallelStrategy` becomes
    class_paths.py  the allow-list of classes a config, flag or checkpoint may name
    resolve.py   the one resolver: a run's settings as fit's parser resolves them
    warnings.py  the one list of warnings hidden by message

Following `fit` from the shell: main.py -> trainer.py (CQKCLI; run/preflight.py once) -> module.py (LitLM) ->
model/gpt.py -> the backend (tests/e2e/test_fit_path.py).
"""

from lightning_cqk.cli.main import EXTRA_COMMANDS, TRAINER_COMMANDS, USAGE, main

__all__ = ["EXTRA_COMMANDS", "TRAINER_COMMANDS", "USAGE", "main"]
