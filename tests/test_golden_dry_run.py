"""``mhjax train --dry-run`` against its golden outputs (tests/golden/, recorded at main's behaviour
before the planner moved out of the experiments: tests/golden_dry_run.py): a refactor leaves
every line as it was, and a line that changes is a fix named in its commit."""

import pytest

from mhjax import cli
from mhjax.train import target as targets
from tests import golden_dry_run as golden


def test_the_quick_configs_dry_run_on_this_cpu_is_its_golden_output(capsys):
    """In this process (seconds): the sequence sweep's plan, estimate, memory and member lines."""
    assert cli.main(["train", "--config", "configs/quick.py", "--dry-run"]) == 0
    got = golden.mask(capsys.readouterr().out) + "exit status: 0\n"
    assert got == (golden.GOLDEN / "cpu-quick.txt").read_text()


def test_the_mask_hides_times_and_the_core_count_only():
    line = "this machine: cpu, 1 device (cpu, 16 cores)\n  chunk all 25          81.5s      1.9 MiB"
    assert golden.mask(line) == "this machine: cpu, 1 device (cpu, <N> cores)\n  chunk all 25  <T>s      1.9 MiB"
    assert golden.mask("  chunk all 25         181.5s      1.9 MiB") == golden.mask(line.splitlines()[1])  # its padding
    kept = "~0.1 s of training without compiles, 0.12 GB; ~0.0374 ms"
    assert golden.mask(kept) == kept  # predictions are the plan's numbers: compared
    assert golden.mask("compile: 12.5 s for 4 executables (111.4 s of wall time") == (
        "compile: <T> s for 4 executables (<T> s of wall time"
    )


# ~1 minute on 2 cores: a fresh process per bundled config
@pytest.mark.slow
@pytest.mark.parametrize("name,argv", golden.runs(False, []), ids=lambda x: x if isinstance(x, str) else "")
def test_every_bundled_configs_cpu_dry_run_is_its_golden_output(name, argv):
    assert golden.compare(name, argv) == []


# ~1-2 minutes each: deviceless compiles for an H200 and an 8-GPU node
@pytest.mark.slow
@pytest.mark.skipif(not targets.compiler_available(), reason="needs jax[cuda13]'s GPU compiler")
@pytest.mark.parametrize(
    "name,argv", [r for r in golden.runs(True, list(golden.TARGET_CONFIGS)) if not r[0].startswith("cpu-")]
)
def test_the_target_dry_runs_are_their_golden_outputs(name, argv):
    assert golden.compare(name, argv) == []


# ~1-2 minutes each: deviceless compiles for an 8-chip v5e slice (recorded with issue 55's kernel,
# before the planner's merge, from branch t55: the planner's move left them as they were)
@pytest.mark.slow
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
@pytest.mark.parametrize("name,argv", [r for r in golden.runs(False, list(golden.TPU_CONFIGS), tpu=True)])
def test_the_tpu_target_dry_runs_are_their_golden_outputs(name, argv):
    assert golden.compare(name, argv) == []
