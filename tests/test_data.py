import jax
import jax.numpy as jnp
import numpy as np

from mhjax.data import sequences


def test_targets_copy_cycle_zero():
    x = jnp.arange(10).reshape(2, 5)
    np.testing.assert_array_equal(sequences.targets_for(0, x), x)
    np.testing.assert_array_equal(sequences.targets_for(1, x)[0], [4, 0, 1, 2, 3])  # target[0] = input[T-1]
    np.testing.assert_array_equal(sequences.targets_for(2, x), 0)


def _keys(seed):
    k = jax.random.PRNGKey(seed)
    return {"dataset": jax.random.fold_in(k, 0), "shuffle": jax.random.fold_in(k, 1), "fresh": jax.random.fold_in(k, 2)}


def test_fixed_protocol_is_a_fixed_dataset_reshuffled_each_epoch():
    kw = dict(protocol="fixed", num_train=12, batch_size=4, length=6, vocab_size=50)
    epoch0 = np.concatenate([np.asarray(sequences.train_batch(_keys(0), 0, s, **kw)[0]) for s in range(3)])
    epoch1 = np.concatenate([np.asarray(sequences.train_batch(_keys(0), 0, s, **kw)[0]) for s in range(3, 6)])
    as_set = lambda a: sorted(map(tuple, a))  # noqa: E731
    assert as_set(epoch0) == as_set(epoch1)  # same 12 sequences
    assert len(set(map(tuple, epoch0))) == 12
    assert not np.array_equal(epoch0, epoch1)  # in another order
    again = np.asarray(sequences.train_batch(_keys(0), 0, 4, **kw)[0])
    np.testing.assert_array_equal(again, epoch1[4:8])  # pure in (key, step)


def test_fresh_protocol_draws_new_sequences_and_eval_is_separate():
    kw = dict(protocol="fresh", num_train=12, batch_size=4, length=6, vocab_size=50)
    a = np.asarray(sequences.train_batch(_keys(0), 1, 0, **kw)[0])
    b = np.asarray(sequences.train_batch(_keys(0), 1, 1, **kw)[0])
    assert not np.array_equal(a, b)
    x, y, w = sequences.eval_batch(jax.random.PRNGKey(9), 1, 5, 6, 50)
    assert x.shape == (5, 6) and x.dtype == jnp.int32 and int(x.max()) < 50
    np.testing.assert_array_equal(y, np.roll(np.asarray(x), 1, axis=-1))
    np.testing.assert_array_equal(w, np.ones((5, 6)))
