"""Every kernel runs on its device's shard of the member axis (issue 39): the training chunk of a
sweep split over N fake CPU devices calls its kernels with members / N, holds no collective,
and trains every member as one device does."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mhjax.models import member_layout
from tests.conftest import FAST_COMPILE

RUNNER = os.path.join(os.path.dirname(__file__), "member_shards_run.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_split_gives_each_shard_its_slice_of_the_groups():
    layout = ((6, 1), (6, 2))
    assert member_layout.split(layout, 2) == [((6, 1),), ((6, 2),)]
    assert member_layout.split(layout, 4) == [((3, 1),), ((3, 1),), ((3, 2),), ((3, 2),)]
    assert member_layout.split(((4, 1), (4, 2)), 4) == [((2, 1),), ((2, 1),), ((2, 2),), ((2, 2),)]
    assert member_layout.split(((3, 1), (5, 2)), 2) == [((3, 1), (1, 2)), ((4, 2),)]
    with pytest.raises(ValueError, match="8 members do not split over 3 devices"):
        member_layout.split(((3, 1), (5, 2)), 3)


def test_spread_deals_every_group_out_evenly_where_it_divides():
    groups = {1: [0, 1, 2, 3], 4: [4, 5, 6, 7]}
    order, layout = member_layout.spread(groups, 2)
    assert order == [0, 1, 4, 5, 2, 3, 6, 7]
    assert layout == ((2, 1), (2, 4), (2, 1), (2, 4))
    shards = member_layout.split(layout, 2)
    assert shards[0] == shards[1] == ((2, 1), (2, 4))  # one program, the same work on each device
    # a group that does not divide the devices: the groups one after another, as on one device
    assert member_layout.spread({1: [0, 1, 2], 4: [3]}, 2) == ([0, 1, 2, 3], ((3, 1), (1, 4)))
    assert member_layout.spread(groups, 1) == ([0, 1, 2, 3, 4, 5, 6, 7], ((4, 1), (4, 4)))


def test_on_shard_runs_the_whole_layout_when_every_member_is_here():
    assert member_layout.on_shard(((2, 1), (2, 4)), 4, lambda local: local) == ((2, 1), (2, 4))
    assert member_layout.on_shard(((2, 1), (2, 4), (2, 1), (2, 4)), 4, lambda local: local) == ((2, 1), (2, 4))
    with pytest.raises(ValueError, match="vmapped over 3 members, the layout has 8"):
        member_layout.on_shard(((4, 1), (4, 4)), 3, lambda local: local)


def _run(devices: int, strategy: str, attention: str, out) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, RUNNER, strategy, attention, str(out)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_same_members(one, many, params_rtol: float) -> None:
    """Member for member, relative to each array's largest value: the losses at 1e-6 and the
    parameters at ``params_rtol``; not the attention key biases, whose gradient is zero in exact
    arithmetic and round-off in fp32, which Adam amplifies (tests/test_sweep.assert_trees_close).
    Adam amplifies round-off of any gradient near its eps, too: XLA's matmuls around the kernels
    round differently at 3 or 6 members than at 12, which moved one element of a value kernel by
    9.8e-7 (3.8e-6 of the array's largest) after 3 steps, all else within 1e-6."""
    a, b = np.load(one), np.load(many)
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        if "'key']['bias'" in key:
            continue
        rtol = 1e-6 if key.endswith("/loss") else params_rtol
        scale = max(float(np.max(np.abs(a[key]))), 1e-30)
        assert float(np.max(np.abs(a[key] - b[key]))) <= rtol * scale, key


@pytest.mark.slow  # three subprocesses compiling and training a 12-member sweep: ~1 minute on 2 cores
def test_cpu_kernel_calls_see_their_shard_and_match_one_device(tmp_path):
    # 12 members in two head-count groups of 6: over 2 devices each device holds 3 of each group
    # (member_layout.spread); over 4, groups of 6 do not divide, so each device runs its own
    # slice's group (a switch on the device index), and the kernels still see 3 members.
    one = _run(1, "one_program", "auto", tmp_path / "one.npz")
    assert one["cpu_kernel_members"] == [12] and one["members"] == 12
    for devices in (2, 4):
        facts = _run(devices, "one_program", "auto", tmp_path / f"{devices}.npz")
        assert facts["devices"] == devices
        assert facts["cpu_kernel_members"] == [12 // devices], facts
        assert facts["all_gathers"] == 0 and facts["collectives"] == 0, facts
        _assert_same_members(tmp_path / "one.npz", tmp_path / f"{devices}.npz", 1e-5)


@pytest.mark.slow  # the Pallas kernels interpreted: ~30 s per subprocess on 2 cores
def test_pallas_calls_see_their_shard_and_match_one_device(tmp_path):
    one = _run(1, "one_program", "pallas", tmp_path / "one.npz")
    assert max(one["pallas_members"]) == 12
    facts = _run(4, "one_program", "pallas", tmp_path / "four.npz")
    # attention, norm_dense and mlp_block: every operand of every call holds 12 / 4 members
    assert facts["pallas_members"] == [3], facts
    assert facts["all_gathers"] == 0 and facts["collectives"] == 0, facts
    # Parameters within 1e-4: the same element as above moved 5.5e-5 of its array's largest here.
    _assert_same_members(tmp_path / "one.npz", tmp_path / "four.npz", 1e-4)
