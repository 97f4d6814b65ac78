"""`python -m lightning_cqk ...` is the same as the `lightning_cqk` console script."""

from lightning_cqk.cli import main

main()
