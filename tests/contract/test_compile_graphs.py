"""Compiled means compiled (issue 32 item 4): every backend's blocks share a few graphs, whatever the depth.

Dynamo keeps at most `recompile_limit` (8) graphs per code object per process; a block whose graph differs per layer
(a Python int or float of the layer baked in) recompiles once per layer and, past 8 layers, silently runs eager. This
compiles each block of a 10-layer model of every registered backend (dynamo's "eager" backend: the graph capture
without inductor's code generation, so it runs in seconds on a CPU), with a recompile-limit hit made an error, and
counts the unique graphs: at most 2, the same at 3 layers as at 10 (a differential layer's lambda_init is a float:
dynamo specialises the first and makes it symbolic from the second). The backends whose q and k come from a fixed
reference stream also run the stream through the blocks (another input shape, and a first block whose input carries
no gradient): at most 3 for them. Before the fix, `rnd_emb_qk` and `fixed_seq_qk` indexed the list of reference
states by their layer index and hit the limit at 8.
"""

from __future__ import annotations

import pytest
from backend_cases import CASES, model_config

from lightning_cqk.attention import available
from lightning_cqk.contract.checks import unique_graphs  # the check-backend row's counter
from lightning_cqk.model.gpt import GPT

FIRST_CASE = {}
for _case in CASES:
    FIRST_CASE.setdefault(_case.backend, _case)


def test_every_registered_backend_is_checked():
    assert set(FIRST_CASE) == set(available())


@pytest.mark.parametrize("backend", sorted(FIRST_CASE))
def test_blocks_share_their_graphs_whatever_the_depth(backend):
    case = FIRST_CASE[backend]
    deep = unique_graphs(case, 10)
    bound = 3 if GPT(model_config(case)).reference_layers else 2
    assert 1 <= deep <= bound, f"{backend}: {deep} graphs for 10 layers"
    assert unique_graphs(case, 3) == deep, f"{backend}: the number of graphs grows with the depth"
