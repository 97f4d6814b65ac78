"""The built-in attention backends, one file a family: standard.py (MHA, shared projections, grouped K/V heads),
differential.py, mla.py, deconstructed_mixing.py and deconstructed_qk.py. Each registers by its class's `name`
(attention/registry.py walks this folder); nothing here is imported by name."""
