"""Where a compiled step's memory traffic goes, by the model part that issued each operation.

XLA's cost analysis gives one total; this walks the optimised HLO text instead: every
instruction of the entry computation and of the computations it calls as loop bodies or
conditions, times their trip counts (not the insides of fusions: a fusion moves its operands and its result once) is
charged its result's bytes plus its operands' bytes, as HloCostAnalysis charges an unfused
or fused op, and attributed by the op_name JAX wrote into its metadata (the Flax module path:
``block_0/ln1``, ``mlp_in``, ``readout``...). Approximate (train/hlo.py's rules: a fusion that
reads a slice of an operand is charged the whole operand unless the slice is its root); its
total is printed beside XLA's for that reason.
"""

from __future__ import annotations

import re
from collections import defaultdict

# The HLO text reader is the package's (the deviceless GPU compile counts bytes the same way).
from mhjax.train.hlo import kernels

KERNELS = "Pallas kernels (as walked)"  # their own bytes are counted analytically (hlo_cost.kernel_cost)

# (part, substrings of "op_name op custom_call_target"), first match wins
PARTS = (
    # the Pallas kernels as compiled (Triton calls) or their stand-ins (hlo_cost.py: host callbacks)
    (KERNELS, ("xla.gpu.triton", "callback")),
    ("matmuls (library calls)", ("custom-call",)),
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
    """{model part: bytes accessed} of an optimised HLO module (compiled.as_text()): train/hlo.py's
    walk (loop bodies times their trip counts), each op attributed by its metadata."""
    out = defaultdict(float)
    for line, op, moved in kernels(hlo_text, weighted=True):
        meta = re.search(r'op_name="([^"]*)"', line)
        target = re.search(r'custom_call_target="([^"]*)"', line) if op == "custom-call" else None
        label = f"{meta.group(1) if meta else ''} {op} {target.group(1) if target else ''}"
        part = next((p for p, keys in PARTS if any(k in label for k in keys)), "other")
        out[part] += moved
    return dict(out)
