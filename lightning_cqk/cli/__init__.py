"""The `lightning_cqk` command line: one wing, one file a job.

    main.py      the entry point: dispatch to a subcommand (imports neither torch nor Lightning: --help is instant)
    trainer.py   CQKCLI, the LightningCLI of fit / validate / test / predict (run directories, precision, budgets)
    glue.py      GlueCLI, the LightningCLI of downstream fine-tuning (chosen when a config names a downstream model)
    glue_command.py  `glue` (every GLUE task x seeds through GlueCLI -> glue.json / glue.md) and `glue-table`
    errors.py    user errors print alone (`--debug` for the traceback)
    hints.py     did-you-mean for unknown config keys
    presets.py   size presets and the shape fields set against them
    warnings.py  the one list of warnings hidden by message

Following `fit` from the shell: main.py -> trainer.py (CQKCLI) -> module.py (LitLM) -> model/gpt.py -> the backend.
"""

from lightning_cqk.cli.main import EXTRA_COMMANDS, TRAINER_COMMANDS, USAGE, main

__all__ = ["EXTRA_COMMANDS", "TRAINER_COMMANDS", "USAGE", "main"]
