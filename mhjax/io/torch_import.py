"""Load PyTorch ``torch.save`` state_dicts without torch and without running pickled code.

A ``torch.save`` file (zip format, torch >= 1.6) is a zip archive::

    <name>/data.pkl        pickle of the state_dict; tensors are REDUCE calls to
                           torch._utils._rebuild_tensor_v2 whose storages are
                           persistent ids ('storage', torch.FloatStorage, '<n>', loc, numel)
    <name>/data/<n>        raw little-endian bytes of storage n
    <name>/byteorder       'little' | 'big' (optional)

A plain ``pickle.load`` would import and call whatever globals the pickle names
(``os.system``, ``builtins.eval`` ...). :class:`_SafeUnpickler` instead maps the
handful of globals a tensor state_dict needs onto local, side-effect-free
functions and refuses everything else with :class:`UnsafeCheckpointError`.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "UnsafeCheckpointError",
    "CheckpointFormatError",
    "load_state_dict",
    "load_reference_params",
    "expected_reference_shapes",
]


class UnsafeCheckpointError(ValueError):
    """The pickle names a global outside the tensor state_dict allow-list."""


class CheckpointFormatError(ValueError):
    """The file is not a readable torch.save state_dict, or it does not match the model."""


_STORAGE_DTYPES: dict[str, np.dtype] = {
    "FloatStorage": np.dtype(np.float32),
    "DoubleStorage": np.dtype(np.float64),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
}


class _StorageType:
    """Stand-in for ``torch.<X>Storage``: only carries the dtype (not callable)."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


class _Storage:
    """A flat storage read from ``data/<key>``."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _check_int_tuple(x, what: str) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise CheckpointFormatError(f"tensor {what} must be a tuple of ints, got {x!r}")
    return tuple(x)


def _rebuild_tensor_v2(
    storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None
) -> np.ndarray:
    """numpy equivalent of ``torch._utils._rebuild_tensor_v2`` (copy of a strided view)."""
    if not isinstance(storage, _Storage):
        raise CheckpointFormatError(f"tensor storage must come from the archive, got {type(storage).__name__}")
    size, stride = _check_int_tuple(size, "size"), _check_int_tuple(stride, "stride")
    if len(size) != len(stride) or not isinstance(storage_offset, int) or storage_offset < 0:
        raise CheckpointFormatError(f"bad tensor geometry offset={storage_offset!r} size={size} stride={stride}")
    if any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise CheckpointFormatError(f"negative size or stride: size={size} stride={stride}")
    flat = storage.array
    if int(np.prod(size, dtype=object)) > 2**32:  # stride-0 views could ask for absurd copies
        raise CheckpointFormatError(f"tensor of size {size} is implausibly large")
    if 0 in size:
        return np.zeros(size, dtype=flat.dtype)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= flat.size:  # bounds check before as_strided, which would read past the buffer
        raise CheckpointFormatError(
            f"tensor (offset {storage_offset}, size {size}, stride {stride}) "
            f"exceeds its storage of {flat.size} elements"
        )
    item = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[storage_offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view, copy=True)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None) -> np.ndarray:
    """``torch._utils._rebuild_parameter``: a Parameter is just its tensor here."""
    if not isinstance(data, np.ndarray):
        raise CheckpointFormatError(f"parameter data must be a tensor, got {type(data).__name__}")
    return data


_ALLOWED_FUNCS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that resolves only allow-listed globals and reads storages from the zip."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: str, byteorder: str):
        super().__init__(io.BytesIO(data))
        self._archive, self._prefix, self._path, self._byteorder = archive, prefix, path, byteorder
        self._storages: dict[str, _Storage] = {}  # tensors may share one storage

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_FUNCS:
            return _ALLOWED_FUNCS[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise UnsafeCheckpointError(f"{self._path}: refused global '{module}.{name}' (not a plain tensor state_dict)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsafeCheckpointError(f"{self._path}: refused persistent id {pid!r:.80}")
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType):
            raise UnsafeCheckpointError(f"{self._path}: refused storage type {stype!r:.80}")
        if not (isinstance(key, str) and re.fullmatch(r"\w+", key)) or not isinstance(numel, int) or numel < 0:
            raise CheckpointFormatError(f"{self._path}: bad storage record {pid!r:.80}")
        if key not in self._storages:
            name = f"{self._prefix}data/{key}"
            try:
                raw = self._archive.read(name)
            except KeyError:
                raise CheckpointFormatError(f"{self._path}: storage {name} is missing from the archive") from None
            nbytes = numel * stype.dtype.itemsize
            if len(raw) < nbytes:
                raise CheckpointFormatError(
                    f"{self._path}: storage {name} has {len(raw)} bytes, expected {nbytes} ({numel} x {stype.dtype})"
                )
            dtype = stype.dtype.newbyteorder("<" if self._byteorder == "little" else ">")
            arr = np.frombuffer(raw, dtype=dtype, count=numel).astype(stype.dtype)  # native order, own copy
            self._storages[key] = _Storage(arr)
        storage = self._storages[key]
        if storage.array.dtype != stype.dtype:
            raise CheckpointFormatError(f"{self._path}: storage {key} used with two dtypes")
        return storage


def _find_pickle(names: list[str], path: str) -> str:
    """The archive's ``<top>/data.pkl`` (the top-level folder name varies)."""
    hits = [n for n in names if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
    if len(hits) != 1:
        raise CheckpointFormatError(
            f"{path}: expected exactly one <folder>/data.pkl in the zip, found {hits or 'none'}"
        )
    return hits[0]


def load_state_dict(path) -> dict[str, np.ndarray]:
    """Read a ``torch.save``-d state_dict as ``{name: numpy array}`` (order preserved).

    Raises :class:`UnsafeCheckpointError` for any global outside the allow-list
    (nothing is imported or called), :class:`CheckpointFormatError` for a
    missing, truncated or malformed file. bfloat16 tensors come back as
    ``ml_dtypes.bfloat16`` arrays.
    """
    path = str(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise CheckpointFormatError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointFormatError(
            f"{path}: not a zip-format torch.save file (truncated, corrupt or legacy format): {e}"
        ) from None
    with archive:
        try:
            names = archive.namelist()
            pkl = _find_pickle(names, path)
            prefix = pkl[: -len("data.pkl")]
            byteorder = "little"
            if f"{prefix}byteorder" in names:
                byteorder = archive.read(f"{prefix}byteorder").decode().strip()
                if byteorder not in ("little", "big"):
                    raise CheckpointFormatError(f"{path}: unknown byteorder {byteorder!r}")
            result = _SafeUnpickler(archive.read(pkl), archive, prefix, path, byteorder).load()
        except (UnsafeCheckpointError, CheckpointFormatError):
            raise
        except (
            pickle.UnpicklingError,
            EOFError,
            zipfile.BadZipFile,
            OSError,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            AttributeError,
            UnicodeDecodeError,
        ) as e:
            raise CheckpointFormatError(f"{path}: corrupt checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(result, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in result.items()
    ):
        raise CheckpointFormatError(f"{path}: pickle is not a flat {{name: tensor}} state_dict")
    return dict(result)


# --------------------------------------------------------------------------- #
# Mapping onto the mhjax Flax param tree
# --------------------------------------------------------------------------- #
def expected_reference_shapes(
    vocab: int, max_len: int, d_model: int, mlp_dim: int, num_layers: int
) -> dict[str, tuple[int, ...]]:
    """Torch key -> shape for the reference decoder (the released checkpoints of arXiv 2507.02944;
    Linear weights are (out, in))."""
    shapes = {"token_emb.weight": (vocab, d_model), "pos_emb.weight": (max_len, d_model)}
    for l in range(num_layers):
        p = f"layers.{l}."
        for proj in ("W_q", "W_k", "W_v", "out_proj"):
            shapes[f"{p}attn.{proj}.weight"] = (d_model, d_model)
            shapes[f"{p}attn.{proj}.bias"] = (d_model,)
        shapes[f"{p}ln1.weight"] = (d_model,)
        shapes[f"{p}ln2.weight"] = (d_model,)
        shapes[f"{p}mlp.0.weight"] = (mlp_dim, d_model)
        shapes[f"{p}mlp.0.bias"] = (mlp_dim,)
        shapes[f"{p}mlp.2.weight"] = (d_model, mlp_dim)
        shapes[f"{p}mlp.2.bias"] = (d_model,)
    shapes["out_proj.weight"] = (vocab, d_model)
    shapes["out_proj.bias"] = (vocab,)
    return shapes


def _dense(sd: dict, name: str) -> dict[str, np.ndarray]:
    # torch Linear computes x @ W.T + b with W (out, in); Flax Dense uses kernel (in, out).
    return {"kernel": np.ascontiguousarray(sd[f"{name}.weight"].T), "bias": sd[f"{name}.bias"]}


def load_reference_params(path, num_heads: int | None = None, strict: bool = True) -> tuple[dict, dict[str, Any]]:
    """Load a reference checkpoint into the mhjax Flax param tree.

    Args:
      path: a ``{H}_heads_{task}.pt`` file (a released checkpoint).
      num_heads: H. The state_dict does not encode it (the head split is a
        reshape), so it is only validated: ``d_model % H == 0`` and, when the
        file name follows ``{H}_heads_*``, that it agrees. ``None`` takes it
        from the file name.
      strict: refuse keys the model does not use.

    Returns:
      ``(params, info)``: params is the Flax tree (numpy float32 arrays)
      ``{'token_emb': {'embedding'}, 'pos_emb': {'embedding'}, 'block_l':
      {'ln1': {'scale'}, 'ln2': {'scale'}, 'attn': {'query'|'key'|'value'|'out':
      {'kernel' (D, D), 'bias'}}, 'mlp_in', 'mlp_out'}, 'readout'}``; info has
      the inferred sizes, ``num_params`` and the source path.

    Raises :class:`CheckpointFormatError` naming the file and the mismatch.
    """
    path = str(path)
    sd = load_state_dict(path)
    m = re.match(r"(\d+)_heads_", Path(path).name)
    if num_heads is None:
        if m is None:
            raise CheckpointFormatError(f"{path}: num_heads not given and not in the file name '{{H}}_heads_*'")
        num_heads = int(m.group(1))
    elif m is not None and int(m.group(1)) != num_heads:
        raise CheckpointFormatError(f"{path}: num_heads={num_heads} but the file name says {m.group(1)} heads")

    for key in ("token_emb.weight", "pos_emb.weight", "layers.0.mlp.0.weight"):
        if key not in sd:
            raise CheckpointFormatError(f"{path}: missing key '{key}'")
        if sd[key].ndim != 2:
            raise CheckpointFormatError(f"{path}: '{key}' should be 2-D, got shape {sd[key].shape}")
    vocab, d_model = sd["token_emb.weight"].shape
    max_len = sd["pos_emb.weight"].shape[0]
    mlp_dim = sd["layers.0.mlp.0.weight"].shape[0]
    num_layers = 1 + max(int(k.split(".")[1]) for k in sd if re.match(r"layers\.\d+\.", k))
    if d_model % num_heads:
        raise CheckpointFormatError(f"{path}: d_model {d_model} is not divisible by num_heads={num_heads}")

    expected = expected_reference_shapes(vocab, max_len, d_model, mlp_dim, num_layers)
    problems = [f"missing key '{k}'" for k in expected if k not in sd]
    problems += [
        f"'{k}' has shape {tuple(sd[k].shape)}, expected {shape}"
        for k, shape in expected.items()
        if k in sd and tuple(sd[k].shape) != shape
    ]
    if strict:
        problems += [f"unexpected key '{k}'" for k in sd if k not in expected]
    if problems:
        raise CheckpointFormatError(f"{path}: " + "; ".join(problems))
    bad_dtype = [
        k for k in expected if not np.issubdtype(sd[k].dtype, np.floating) and sd[k].dtype != ml_dtypes.bfloat16
    ]
    if bad_dtype:
        raise CheckpointFormatError(f"{path}: non-float parameters {bad_dtype}")
    sd = {k: np.asarray(sd[k], dtype=np.float32) for k in expected}

    params: dict[str, Any] = {
        "token_emb": {"embedding": sd["token_emb.weight"]},
        "pos_emb": {"embedding": sd["pos_emb.weight"]},
    }
    for l in range(num_layers):
        p = f"layers.{l}."
        params[f"block_{l}"] = {
            "ln1": {"scale": sd[f"{p}ln1.weight"]},
            "ln2": {"scale": sd[f"{p}ln2.weight"]},
            "attn": {
                "query": _dense(sd, f"{p}attn.W_q"),
                "key": _dense(sd, f"{p}attn.W_k"),
                "value": _dense(sd, f"{p}attn.W_v"),
                "out": _dense(sd, f"{p}attn.out_proj"),
            },
            "mlp_in": _dense(sd, f"{p}mlp.0"),
            "mlp_out": _dense(sd, f"{p}mlp.2"),
        }
    params["readout"] = _dense(sd, "out_proj")
    info = {
        "path": path,
        "num_heads": num_heads,
        "head_dim": d_model // num_heads,
        "num_layers": num_layers,
        "d_model": d_model,
        "mlp_dim": mlp_dim,
        "vocab_size": vocab,
        "max_len": max_len,
        "num_params": int(sum(v.size for v in sd.values())),
    }
    return params, info
