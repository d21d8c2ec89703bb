"""Safe torch.save loader (mhjax.io.torch_import): real checkpoints, crafted and hostile files."""

import os
import pickle
import re
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mhjax.io import torch_import as ti
from mhjax.io.torch_import import CheckpointFormatError, UnsafeCheckpointError, load_reference_params, load_state_dict

CKPT_DIR = Path(__file__).resolve().parents[1].parent / "shared/reference/beyond_parallelism/checkpoints"
CKPTS = [CKPT_DIR / f"{h}_heads_{task}.pt" for h in (1, 4, 8, 16) for task in ("copy", "cycle")]
needs_ckpts = pytest.mark.skipif(
    not all(p.exists() for p in CKPTS), reason=f"reference checkpoints not found under {CKPT_DIR}"
)


# ------------------------ hand-written torch.save pickles ---------------------
def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def _tuple(items) -> bytes:
    return b"(" + b"".join(items) + b"t"


def tensor_pickle(entries) -> bytes:
    """Protocol-2 pickle of an OrderedDict of tensors, laid out like torch.save does.

    entries: (name, storage_type, storage_key, numel, offset, size, stride).
    """
    out = b"\x80\x02" + b"ccollections\nOrderedDict\n)R("
    for name, stype, key, numel, offset, size, stride in entries:
        pid = _tuple([_str("storage"), f"ctorch\n{stype}\n".encode(), _str(key), _str("cpu"), _int(numel)])
        args = _tuple(
            [
                pid + b"Q",
                _int(offset),
                _tuple(map(_int, size)),
                _tuple(map(_int, stride)),
                b"\x89",
                b"ccollections\nOrderedDict\n)R",
            ]
        )
        out += _str(name) + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R"
    return out + b"u."


def write_zip(path, pkl: bytes, storages: dict, top: str = "whatever_name"):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{top}/data.pkl", pkl)
        z.writestr(f"{top}/byteorder", "little")
        for key, arr in storages.items():
            z.writestr(f"{top}/data/{key}", np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        z.writestr(f"{top}/version", "3\n")


def test_crafted_dtypes_offsets_strides_and_shared_storage(tmp_path):
    base = np.arange(12, dtype=np.float32)
    half = np.arange(6, dtype=np.float16) / 4
    bf = (np.arange(4, dtype=np.float32) - 1.5).astype(ml_dtypes.bfloat16)
    longs = np.array([-3, 2**40, 7], dtype=np.int64)
    pkl = tensor_pickle(
        [
            ("plain", "FloatStorage", "0", 12, 0, (3, 4), (4, 1)),
            ("transposed", "FloatStorage", "0", 12, 0, (4, 3), (1, 4)),  # shares storage 0
            ("offset", "FloatStorage", "0", 12, 5, (2, 3), (3, 1)),
            ("half", "HalfStorage", "1", 6, 0, (6,), (1,)),
            ("bf16", "BFloat16Storage", "2", 4, 1, (3,), (1,)),
            ("long", "LongStorage", "3", 3, 0, (3,), (1,)),
            ("scalar", "FloatStorage", "0", 12, 7, (), ()),
        ]
    )
    f = tmp_path / "crafted.pt"
    write_zip(f, pkl, {"0": base, "1": half, "2": bf, "3": longs})
    sd = load_state_dict(f)
    assert list(sd) == ["plain", "transposed", "offset", "half", "bf16", "long", "scalar"]
    np.testing.assert_array_equal(sd["plain"], base.reshape(3, 4))
    np.testing.assert_array_equal(sd["transposed"], base.reshape(3, 4).T)
    np.testing.assert_array_equal(sd["offset"], base[5:11].reshape(2, 3))
    assert sd["half"].dtype == np.float16 and np.array_equal(sd["half"], half)
    assert sd["bf16"].dtype == ml_dtypes.bfloat16 and np.array_equal(sd["bf16"], bf[1:])
    assert sd["long"].dtype == np.int64 and np.array_equal(sd["long"], longs)
    assert sd["scalar"].shape == () and sd["scalar"] == 7.0


def test_out_of_bounds_view_is_rejected(tmp_path):
    f = tmp_path / "oob.pt"
    write_zip(f, tensor_pickle([("x", "FloatStorage", "0", 4, 2, (2, 2), (2, 1))]), {"0": np.zeros(4, np.float32)})
    with pytest.raises(CheckpointFormatError, match="exceeds its storage"):
        load_state_dict(f)


# ------------------------------- hostile files --------------------------------
class _Shell:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


class _Eval:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "nested"])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, kind):
    marker = tmp_path / "pwned"
    if kind == "os.system":
        payload = {"w": _Shell(f"touch {marker}")}
        refused = r"(posix|os|nt)\.system"
    elif kind == "builtins.eval":
        payload = {"w": _Eval(f"open({str(marker)!r}, 'w').close()")}
        refused = r"(__builtin__|builtins)\.eval"  # protocol 2 writes the py2 module name
    else:  # hidden after a legitimate-looking OrderedDict
        payload = [__import__("collections").OrderedDict(a=1), {"deep": [_Shell(f"touch {marker}")]}]
        refused = r"(posix|os|nt)\.system"
    f = tmp_path / "evil.pt"
    protocol = pickle.HIGHEST_PROTOCOL if kind == "nested" else 2  # also STACK_GLOBAL
    write_zip(f, pickle.dumps(payload, protocol=protocol), {})
    with pytest.raises(UnsafeCheckpointError, match=refused) as exc:
        load_state_dict(f)
    msg = str(exc.value)
    assert str(f) in msg and "\n" not in msg
    assert isinstance(exc.value, ValueError)
    assert not marker.exists()


# Globals a pickle could name: lookalikes of the allowed ones under other modules or names,
# builtins under both spellings, numpy reconstructors, pickle helpers, torch itself.
REFUSED_GLOBALS = [
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "getattr"),
    ("builtins", "__import__"),
    ("builtins", "open"),
    ("__builtin__", "eval"),
    ("__builtin__", "getattr"),
    ("__builtin__", "apply"),
    ("os", "system"),
    ("posix", "system"),
    ("nt", "system"),
    ("subprocess", "Popen"),
    ("shutil", "rmtree"),
    ("numpy", "load"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy", "frombuffer"),
    ("_codecs", "encode"),
    ("copyreg", "_reconstructor"),
    ("copy_reg", "_reconstructor"),
    ("functools", "partial"),
    ("collections", "defaultdict"),
    ("collections", "OrderedDict.fromkeys"),
    ("collections", "namedtuple"),
    ("torch", "load"),
    ("torch", "Tensor"),
    ("torch", "FloatStorage.__class__"),
    ("torch", "UntypedStorage"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_tensor_v2.__globals__"),
    ("torch._utils", "_rebuild_from_type_v2"),
    ("torch._utils", "_rebuild_qtensor"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"),
    ("torch.utils", "_rebuild_tensor_v2"),
    ("torch_utils", "_rebuild_tensor_v2"),
    ("torch._utils.x", "_rebuild_tensor_v2"),
    ("_utils", "_rebuild_tensor_v2"),
    ("Torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils ", "_rebuild_tensor_v2"),
    ("collections ", "OrderedDict"),
    ("mhjax.io.torch_import", "_rebuild_tensor_v2"),
    ("mhjax.io.torch_import", "_ALLOWED_FUNCS"),
    ("torch", "_utils"),
    ("__main__", "Evil"),
    ("pickle", "loads"),
    ("marshal", "loads"),
    ("types", "FunctionType"),
]


def _global_pickles(module: str, name: str) -> dict[str, bytes]:
    """The opcodes that resolve a global: GLOBAL (+REDUCE), STACK_GLOBAL, INST, OBJ."""
    m, n = module.encode(), name.encode()
    return {
        "GLOBAL": b"\x80\x02c" + m + b"\n" + n + b"\n)R.",
        "STACK_GLOBAL": b"\x80\x04" + _str(module) + _str(name) + b"\x93)R.",
        "INST": b"(i" + m + b"\n" + n + b"\n.",
        "OBJ": b"\x80\x02(c" + m + b"\n" + n + b"\no.",
        "nested": b"\x80\x02ccollections\nOrderedDict\n)R" + _str("w") + b"]c" + m + b"\n" + n + b"\n)Ra\x86.",
    }


@pytest.mark.parametrize("module,name", REFUSED_GLOBALS, ids=lambda x: repr(x))
def test_every_global_outside_the_allow_list_is_refused(tmp_path, module, name):
    assert (module, name) not in ti._ALLOWED_FUNCS
    for opcode, pkl in _global_pickles(module, name).items():
        f = tmp_path / f"{opcode}.pt"
        write_zip(f, pkl, {})
        with pytest.raises(UnsafeCheckpointError) as exc:
            load_state_dict(f)
        assert f"refused global '{module}.{name}'" in str(exc.value), (opcode, str(exc.value))


def test_the_allow_list_is_exactly_the_tensor_state_dict_needs():
    assert set(ti._ALLOWED_FUNCS) == {
        ("collections", "OrderedDict"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
    }
    assert all(not isinstance(f, type(os)) for f in ti._ALLOWED_FUNCS.values())
    assert ti._ALLOWED_FUNCS[("torch._utils", "_rebuild_tensor_v2")].__module__ == "mhjax.io.torch_import"


def test_non_state_dict_pickle_is_rejected(tmp_path):
    f = tmp_path / "list.pt"
    write_zip(f, pickle.dumps([1, 2, 3], protocol=2), {})
    with pytest.raises(CheckpointFormatError, match="state_dict"):
        load_state_dict(f)


@needs_ckpts
def test_truncated_and_corrupt_files_give_clear_errors(tmp_path):
    raw = CKPTS[0].read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointFormatError, match=re.escape(str(cut))):
        load_state_dict(cut)
    # valid zip, truncated pickle
    bad = tmp_path / "badpkl.pt"
    with zipfile.ZipFile(CKPTS[0]) as zin, zipfile.ZipFile(bad, "w") as zout:
        for n in zin.namelist():
            data = zin.read(n)
            zout.writestr(n, data[: len(data) // 2] if n.endswith("data.pkl") else data)
    with pytest.raises(CheckpointFormatError, match="corrupt"):
        load_state_dict(bad)
    # missing storage file
    nostore = tmp_path / "nostore.pt"
    with zipfile.ZipFile(CKPTS[0]) as zin, zipfile.ZipFile(nostore, "w") as zout:
        for n in zin.namelist():
            if not n.endswith("/data/0"):
                zout.writestr(n, zin.read(n))
    with pytest.raises(CheckpointFormatError, match="missing from the archive"):
        load_state_dict(nostore)
    with pytest.raises(CheckpointFormatError, match="no such file"):
        load_state_dict(tmp_path / "absent.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x80\x02not a zip")
    with pytest.raises(CheckpointFormatError, match="not a zip"):
        load_state_dict(junk)


# ----------------------------- real checkpoints --------------------------------
def _raw_tensor(path: Path, name: str) -> np.ndarray:
    """Independent reading: storages of the reference files are contiguous float32, one per tensor."""
    with zipfile.ZipFile(path) as z:
        top = z.namelist()[0].split("/")[0]
        pkl = z.read(f"{top}/data.pkl")
        i = pkl.index(_str(name))  # exact BINUNICODE key, not a substring of a longer key
        key = re.search(rb"X\x01\x00\x00\x00(\d)|X\x02\x00\x00\x00(\d\d)", pkl[i:]).group(0)[5:].decode()
        return np.frombuffer(z.read(f"{top}/data/{key}"), dtype="<f4")


@needs_ckpts
@pytest.mark.parametrize("path", CKPTS, ids=lambda p: p.stem)
def test_reference_checkpoint_maps_to_param_tree(path):
    sd = load_state_dict(path)
    expected = ti.expected_reference_shapes(256, 100, 64, 128, 4)
    assert {k: v.shape for k, v in sd.items()} == expected
    assert all(v.dtype == np.float32 for v in sd.values())

    H = int(path.name.split("_")[0])
    params, info = load_reference_params(path, H)
    assert info["num_params"] == 172_800 and info["num_layers"] == 4 and info["head_dim"] == 64 // H
    assert set(params) == {"token_emb", "pos_emb", "readout"} | {f"block_{l}" for l in range(4)}
    shapes = {
        "ln1": {"scale": (64,)},
        "ln2": {"scale": (64,)},
        "attn": {p: {"kernel": (64, 64), "bias": (64,)} for p in ("query", "key", "value", "out")},
        "mlp_in": {"kernel": (64, 128), "bias": (128,)},
        "mlp_out": {"kernel": (128, 64), "bias": (64,)},
    }
    for l in range(4):
        got = {
            k: (
                {
                    kk: ({k3: a.shape for k3, a in vv.items()} if isinstance(vv, dict) else vv.shape)
                    for kk, vv in v.items()
                }
            )
            for k, v in params[f"block_{l}"].items()
        }
        assert got == shapes
    assert params["token_emb"]["embedding"].shape == (256, 64)
    assert params["readout"]["kernel"].shape == (64, 256)

    # transposition against the raw (out, in) row-major bytes
    wq = _raw_tensor(path, "layers.2.attn.W_q.weight").reshape(64, 64)
    np.testing.assert_array_equal(params["block_2"]["attn"]["query"]["kernel"], wq.T)
    w1 = _raw_tensor(path, "layers.1.mlp.0.weight").reshape(128, 64)
    np.testing.assert_array_equal(params["block_1"]["mlp_in"]["kernel"], w1.T)
    wo = _raw_tensor(path, "out_proj.weight").reshape(256, 64)
    np.testing.assert_array_equal(params["readout"]["kernel"], wo.T)
    np.testing.assert_array_equal(params["block_3"]["ln2"]["scale"], sd["layers.3.ln2.weight"])
    np.testing.assert_array_equal(params["block_0"]["attn"]["out"]["bias"], sd["layers.0.attn.out_proj.bias"])


@needs_ckpts
def test_validation_errors_name_file_and_mismatch(monkeypatch):
    path = CKPTS[2]  # 4_heads_copy
    sd = load_state_dict(path)
    with pytest.raises(CheckpointFormatError, match="file name says 4"):
        load_reference_params(path, 8)
    assert load_reference_params(path)[1]["num_heads"] == 4  # from the name

    broken = dict(sd)
    del broken["layers.1.ln2.weight"]
    broken["layers.0.mlp.2.weight"] = np.zeros((128, 64), np.float32)
    broken["extra.weight"] = np.zeros(3, np.float32)
    monkeypatch.setattr(ti, "load_state_dict", lambda p: broken)
    with pytest.raises(CheckpointFormatError) as exc:
        load_reference_params(path, 4)
    msg = str(exc.value)
    assert str(path) in msg
    assert "missing key 'layers.1.ln2.weight'" in msg
    assert "'layers.0.mlp.2.weight' has shape (128, 64), expected (64, 128)" in msg
    assert "unexpected key 'extra.weight'" in msg
    del broken["extra.weight"]
    with pytest.raises(CheckpointFormatError, match="not divisible"):
        load_reference_params("model.pt", 3)
