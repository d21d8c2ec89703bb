"""`mhjax sample --workdir W --member M --prompt TEXT`: a member's continuation of a prompt
(mhjax/workflows/sample.py), printed as text or token ids."""

from __future__ import annotations

import sys

from mhjax.workflows.sample import member_sample


def command(args, overrides) -> int:
    result = member_sample(
        args.workdir,
        args.member,
        args.prompt,
        args.tokens,
        args.temperature,
        args.top_k,
        args.seed,
        args.step,
        args.vocab,
        " " if args.join is None else args.join,
    )
    top = args.top_k or "all"
    print(
        f"{args.member} at step {result.step}: {len(result.ids)} tokens at temperature {args.temperature:g}, "
        f"top-k {top}, seed {args.seed}; the model sees the last {result.context} tokens",
        file=sys.stderr,
    )
    if result.text is not None:
        print(result.text)
    else:
        print(" ".join(str(int(i)) for i in (*result.prompt_ids, *result.ids)))
    return 0
