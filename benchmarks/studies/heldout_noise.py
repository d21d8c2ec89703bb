"""How many held-out windows give a standard error of at most 0.01 bits per byte (issue 48):
the spread of per-window bits over a corpus's held-out part, for the n-gram baselines of
data/ngram.py (a proxy for a trained model's: how much the text's difficulty varies from window
to window), at configs/text.py's T = 256 on ``--num`` windows drawn as the sweep draws them.

    python examples/python_docs.py docs.txt --kib 3072
    python benchmarks/studies/heldout_noise.py docs.txt [--seq-len 256] [--num 4096]

Prints each model's mean bits, the per-window standard deviation, the standard error at --num
windows and the windows a standard error of 0.01 needs ((sd / 0.01)^2)."""

from __future__ import annotations

import argparse
import math
import time

import jax
import numpy as np

from mhjax.data import ngram, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--num", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=256)
    args = parser.parse_args()
    corpus = text.load(args.path)
    starts = np.asarray(text.window_starts(jax.random.PRNGKey(0), args.num, corpus.heldout.size, args.seq_len))
    windows = text.read_windows(corpus.heldout, starts, args.seq_len)
    started = time.perf_counter()
    model = ngram.NGram(corpus.train, args.vocab)
    counted = time.perf_counter() - started
    print(
        f"{args.path}: {corpus.size:,} bytes, held-out {corpus.heldout.size:,}; "
        f"{args.num} windows of T = {args.seq_len}"
    )
    print(f"counted in {counted:.2f} s")
    for k, name in ngram.ORDERS.items():
        started = time.perf_counter()
        per_window = model.window_bits(windows, k).mean(axis=1)
        sd = per_window.std(ddof=1)
        print(
            f"{name:8s} {per_window.mean():.4f} bits/byte, per-window sd {sd:.4f}, SE at {args.num} "
            f"{sd / math.sqrt(args.num):.4f}, windows for SE <= 0.01: {math.ceil((sd / 0.01) ** 2):,} "
            f"(scored in {time.perf_counter() - started:.2f} s)"
        )


if __name__ == "__main__":
    main()
