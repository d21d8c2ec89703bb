import os
import sys

import ml_collections
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Many tests (and the subprocesses they start) compile the same tiny programs: share XLA's
# persistent compilation cache between them. Set before jax is imported anywhere.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".pytest_cache", "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The suite is compile-bound (tiny models, few steps): LLVM at -O0 halves XLA's CPU compile time
# and changes no number the tests check (HLO passes, fusion and the arithmetic are the same).
# Subprocess tests that set their own XLA_FLAGS add FAST_COMPILE to them.
FAST_COMPILE = "--xla_backend_optimization_level=0"
if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE).strip()
# The tests are CPU tests. Where jax[cuda13] is installed (to compile for a GPU target) but no
# GPU is, JAX would otherwise log a cuPTI traceback at every backend start.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# End-of-training images cost ~1 s a member (matplotlib) in every one of the suite's many tiny
# runs: off by default here (mhjax/train/run_end.py); the tests of the images turn them on.
os.environ.setdefault("MHJAX_IMAGES", "0")


def tiny_sequence_config(**sweep):
    """The paper config shrunk to run in seconds: width 16, 1 layer, length 8."""
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "grouped"
    config.attention = "auto"
    fields = dict(task=("copy",), heads=(1, 4), seed=(0,), learning_rate=(3e-3,))
    fields.update({k: tuple(v) for k, v in sweep.items()})
    config.sweep = ml_collections.ConfigDict(fields)
    config.model = ml_collections.ConfigDict(
        dict(width=16, num_layers=1, mlp_dim=32, vocab_size=16, seq_len=8, dropout=0.1)
    )
    config.data = ml_collections.ConfigDict(dict(protocol="fixed", num_train=16, batch_size=4, num_eval=8))
    config.train = ml_collections.ConfigDict(dict(steps=6, chunk_steps=3, eval_every=3, checkpoint_every=3))
    return config


@pytest.fixture(scope="module")
def images_on():
    """End-of-training images drawn for the module's runs (the suite leaves them out)."""
    previous = os.environ.get("MHJAX_IMAGES")
    os.environ["MHJAX_IMAGES"] = "1"
    yield
    if previous is None:
        os.environ.pop("MHJAX_IMAGES", None)
    else:
        os.environ["MHJAX_IMAGES"] = previous


def config_source(config) -> str:
    """The text of a config file whose get_config() returns ``config`` (for subprocess runs)."""
    return f"import ml_collections\n\n\ndef get_config():\n    return ml_collections.ConfigDict({config.to_dict()!r})\n"


def tiny_train(config, steps, chunk_steps, eval_every, checkpoint_every):
    with config.train.unlocked():
        config.train.update(
            dict(steps=steps, chunk_steps=chunk_steps, eval_every=eval_every, checkpoint_every=checkpoint_every)
        )
    return config


def set_field(config, field: str, value):
    """config.<field> = value for a dotted field, e.g. "init.scheme" (bypassing the config's lock)."""
    node = config
    *path, last = field.split(".")
    for part in path:
        node = node[part]
    with node.unlocked():
        node[last] = value
    return config


@pytest.fixture
def tiny_config():
    return tiny_sequence_config


# The trained tiny workdir of the bad-input tests (tests/errors_common.py), one per test module.
from tests.errors_common import trained, workdir_copy  # noqa: E402, F401

# The heaviest files first (measured: pytest --durations=0, 2026-12-05): with `--dist loadfile`
# each file runs whole on one worker, so a heavy file left for last keeps one core busy while
# the other idles. Collection order otherwise, and each file's own order, are kept.
HEAVY_FIRST = (
    "test_sweep",
    "test_pallas_attention",
    "test_growth",
    "test_text",
    "test_mixture_plugins",
    "test_model",
    "test_resume_records",
    "test_distributed",
    "test_bfloat16",
    "test_forward",
    "test_tasks",
    "test_bfloat16_kernels",
    "test_snapshots",
    "test_cpu_attention",
    "test_mixture_sweep",
    "test_pallas_block",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(HEAVY_FIRST)))
