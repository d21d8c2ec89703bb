"""benchmarks/torch_model.py: the torch.func ensemble trainer (the strongest PyTorch peer in
benchmarks/throughput.py) trains each member exactly as the one-model trainer does."""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from torch_model import EnsembleTrainer, Trainer  # noqa: E402

TINY = dict(vocab_size=16, length=8, width=16, num_layers=2, mlp_dim=24, dropout=0.0, batch_size=4, learning_rate=1e-2)


@pytest.mark.parametrize("heads", [1, 4])
def test_ensemble_member_equals_one_model_trainer(heads):
    """Same init and batches (seeds 3 and 7), no dropout, the same attention code: after 3 Adam
    steps every member of the vmapped ensemble has the one-model trainer's losses and
    parameters."""
    torch.set_num_threads(1)
    seeds, steps = (3, 7), 3
    ensemble = EnsembleTrainer(heads, seeds, impl="manual", **TINY)
    singles = [Trainer(heads, seed=s, impl="manual", **TINY) for s in seeds]
    for _ in range(steps):
        ensemble_losses = ensemble.step().detach().numpy()
        single_losses = [float(t.step().detach()) for t in singles]
        np.testing.assert_allclose(ensemble_losses, single_losses, rtol=1e-5)
    for j, trainer in enumerate(singles):
        member = ensemble.member_state(j)
        reference = trainer.model.state_dict()
        assert set(member) == set(reference)
        for name, value in reference.items():
            if name.endswith("attn.key.bias"):
                # Its gradient is zero in exact arithmetic (q . b_k shifts a whole row of scores,
                # which softmax ignores); Adam scales the rounding noise left in its place to
                # steps of up to ~lr, batched and unbatched matmuls round differently, so only
                # Adam's bound holds: |difference| <= 2 x steps x lr.
                bound = 2 * steps * TINY["learning_rate"]
                assert np.abs(member[name].numpy() - value.numpy()).max() <= bound, name
                continue
            np.testing.assert_allclose(member[name].numpy(), value.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    # the members really differ (different seeds), so the equality above is per member
    assert not torch.equal(ensemble.member_state(0)["readout.weight"], ensemble.member_state(1)["readout.weight"])


def test_ensemble_dropout_differs_between_members_of_the_same_seed():
    """randomness="different": two members with the same init and batches but their own
    dropout masks end the first step with different losses."""
    torch.manual_seed(0)
    ensemble = EnsembleTrainer(2, (5, 5), **{**TINY, "dropout": 0.5})
    losses = ensemble.step().detach().numpy()
    assert losses[0] != losses[1]
