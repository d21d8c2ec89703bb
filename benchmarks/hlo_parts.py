"""Where a compiled step's memory traffic goes, by the model part that issued each operation.

XLA's cost analysis gives one total; this walks the optimised HLO text instead: every
instruction of the entry computation and of the computations it calls as loop bodies or
conditions (not the insides of fusions: a fusion moves its operands and its result once) is
charged its result's bytes plus its operands' bytes, as HloCostAnalysis charges an unfused
or fused op, and attributed by the op_name JAX wrote into its metadata (the Flax module path:
``block_0/ln1``, ``mlp_in``, ``readout``...). Approximate (a fusion that reads a slice of an
operand is charged the whole operand); its total is printed beside XLA's for that reason.
"""

from __future__ import annotations

import re
from collections import defaultdict

# The HLO text reader is the package's (the deviceless GPU compile counts bytes the same way).
from mhjax.train.hlo import FREE, INSTRUCTION, top_level
from mhjax.train.hlo import computations as _computations
from mhjax.train.hlo import type_bytes as _bytes

# (part, substrings of "op_name op"), first match wins
PARTS = (
    ("attention kernel (stand-in)", ("custom-call",)),
    ("embeddings", ("token_emb", "pos_emb", "Transformer))/add ", "Transformer)))/add ")),
    ("norms", ("/ln1/", "/ln2/")),
    ("attention projections", ("/attn/",)),
    ("MLP, relu and its dropout", ("/mlp_in/", "/mlp_out/", "HashDropout", "relu", "/select_n ")),
    ("residual adds", ("/add ",)),
    ("logits and cross-entropy", ("readout", "cross_entropy", "log_softmax", "logsumexp", "/reduce_max")),
    ("Adam, update, divergence check", ("closed_call/vmap()/", "_where", "opt_state", "adam")),
    ("data and keys", ("randint", "threefry", "train_batch", "random_bits", "_data_keys")),
)


def bytes_by_part(hlo_text: str) -> dict[str, float]:
    """{model part: bytes accessed} of an optimised HLO module (compiled.as_text())."""
    comps, entry = _computations(hlo_text)
    out = defaultdict(float)
    for name in top_level(comps, entry):
        sizes = {}
        for line in comps[name]:
            result, rhs = line.split(" = ", 1)
            match = INSTRUCTION.match(rhs)
            if not match:
                continue
            out_type, op, args = match.groups()
            sizes[result] = _bytes(out_type)
            if op in FREE:
                continue
            operands = sum(sizes.get(a.strip().split()[-1], 0) for a in args.split(",") if a.strip())
            meta = re.search(r'op_name="([^"]*)"', line)
            label = f"{meta.group(1) if meta else ''} {op}"
            part = next((p for p, keys in PARTS if any(k in label for k in keys)), "other")
            out[part] += sizes[result] + operands
    return dict(out)
