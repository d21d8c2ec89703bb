"""Multi-head attention on the tokenized mixture (arXiv 2310.12680): GD, H 1..64 x 3 seeds x 2 n, NTK margins.

Paper: "On the Optimization and Generalization of Multi-head Attention" (Deora, Ghaderi, Taheri,
Thrampoulidis; arXiv 2310.12680).
All 42 members (7 head counts x 3 seeds x 2 training-set sizes) run in ONE compiled
program: heads padded to 64 and masked, training sets padded to the largest n with zero
weights. theta_0 = random decoders U_h ~ N(0, tau^2) per head with tau = 0.1, W = 0 (init.scheme
"random_decoders", the default: heads differ, so H is a width and not a learning rate); plain
full-batch GD with a constant step on the logistic loss. tau = 0.1 was chosen with
configs/mixture_init.py (README, "Mixture: the init scale"): at tau = 1 the random function
Phi(theta_0) is fitted around rather than removed and the test accuracy at n = 128 is 0.66 (H = 1)
to 0.87 (H = 64); at tau = 0.1 every H reaches 0.97-0.99 and the heads still differ (head_spread
1.1-1.4 at theta_K). Data: the generator's defaults (T=8 tokens, 2 of them
relevant, 1 relevant cluster per label, 4 noise clusters, S=3, sigma=1) but tokens in d=8
instead of 16 (a third of the cost per head). At n=128 the mean token is not linearly
separable while the flattened tokens (T*d = 64 numbers) still are, with a small margin.
Every member's cost is that of an H=64, n=128 member (padding), so it is the sweep's size.
Measured at tau = 0.1 on 2 free CPU cores: 1 min 20 s wall, 68 s in the loop (92 member-steps/s
including compilation and the evaluations); 4 min 10 s at tau = 1 under a load of ~5 before (tau
does not change the cost). Members differing only in n share theta_0 (their key leaves n out).

Outputs in the workdir besides the core ones (results.json/.md, tb/, checkpoints):
loss_vs_K.png, test_loss_vs_n.png, ntk_margin_vs_H.png and mixture_summary.md.
"""

import ml_collections

from mhjax.data.mixture import default_mixture_config


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "mixture"
    config.seed = 0
    config.strategy = "auto"  # ignored: a mixture sweep is always one program
    config.devices = 0  # devices the member axis is sharded over; 0 = all

    config.sweep = ml_collections.ConfigDict()
    config.sweep.heads = (1, 2, 4, 8, 16, 32, 64)
    config.sweep.seed = (0, 1, 2)
    config.sweep.num_train = (32, 128)  # n; the n=32 set is the first 32 examples of the n=128 set
    config.sweep.step_size = (1.0,)

    config.data = default_mixture_config()  # dim, seq_len, clusters, fraction, norm, noise
    config.data.dim = 8
    config.data.num_test = 500  # fresh test examples per seed (the same for every H and n of a seed)

    config.model = ml_collections.ConfigDict()
    config.model.query = "full"  # full (every token a query) | first (first-token query)

    config.init = ml_collections.ConfigDict()
    # random_decoders (default: U_h ~ N(0, tau^2) per head, W = 0: heads differ, so H is a width) |
    # antisymmetric (pairs U, -U: Phi(theta_0) = 0) | zero_plus_step (degenerate: identical heads,
    # H acts as a learning rate) | random (all entries N(0, tau^2)). See mhjax/experiments/mixture.py.
    config.init.scheme = "random_decoders"
    config.init.tau = 0.1  # std of the random decoders (chosen with configs/mixture_init.py; 1.0 before)
    # One GD step of this size after the draw; None = none (zero_plus_step: the member's step size).
    config.init.first_step = ml_collections.FieldReference(None, field_type=float)
    # True: head h's draw from (seed, h) only, so every H of a seed starts from the first H heads of one
    # draw (paired comparisons across H; docs/mixture.md "Nested heads" measures it). Off: the bundled numbers.
    config.init.nested_heads = False

    config.analysis = ml_collections.ConfigDict()
    config.analysis.lanczos_iters = 16  # Hessian extreme eigenvalues, every train.eval_every steps
    config.analysis.margin_iters = 20000  # cap of the simplex (Frank-Wolfe) margin solver
    config.analysis.margin_tol = 1e-4  # relative duality gap at which the solver stops

    config.train = ml_collections.ConfigDict()
    config.train.steps = 150
    config.train.chunk_steps = 10  # evaluations and checkpoints happen between chunks
    config.train.eval_every = 75  # test loss, ||grad L||/L and the Hessian ratio along training
    config.train.checkpoint_every = 150
    config.train.eval_points = 0  # evaluations at log-spaced k (and k = 0) besides every eval_every steps
    config.train.steps_per_example = 0.0  # > 0: a member's own K = this * n (then step size 0 up to train.steps)
    config.train.loss_points = 30  # exact L(theta_k) at ~30 log-spaced k (results field loss_curve)
    config.train.trace = True  # L, margin, ||grad L||/L, ||theta|| per step to W/trace (run.trace; docs/mixture.md)
    # theta_k of every member kept at k = 0 and 7 log-spaced k up to K (32 KiB per member, 10.5 MiB
    # in all): run.ntk(member, k) and run.analyze(steps="all") at each, the NTK margin along training
    config.train.snapshot_steps = "log:8"
    return config
