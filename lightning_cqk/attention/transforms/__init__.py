"""The built-in q/k transforms (the coupling of queries and keys, attention/transform.py is the stage they plug into):
dynamics.py (v1 coupled dynamics and its uncoupled control), coupled_flow.py (its fast path with a hand-written
backward), coupling.py (v2 invertible affine coupling), coupled.py (the v1 backend names `coupled` and
`uncoupled_mlp`: standard attention plus the transform). Each registers by its class's `kind` or `name`."""
