"""lightning_cqk: a PyTorch Lightning framework for side-by-side research on attention mechanisms.

Model code (`lightning_cqk.model_config`, `lightning_cqk.attention`, `lightning_cqk.model`) imports only torch; the
Lightning-aware pieces are `lightning_cqk.module`, `lightning_cqk.data`, `lightning_cqk.callbacks` and the CLI.
"""

__version__ = "0.1.0"
