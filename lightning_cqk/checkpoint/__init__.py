"""Checkpoints as files: reading one (reading.py: intact? trusted? the package's one torch.load), loading an FSDP2
folder without running code from it (folder.py), and `lightning_cqk consolidate` (consolidate.py). The checkpoint
callbacks that write them (RunCheckpoint, BestCheckpoint, AtomicCheckpointIO) stay in callbacks/run_checkpoint.py:
they build on the validation schedule of callbacks/ (docs/layout.md)."""
