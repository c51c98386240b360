"""Model state: find a model's tensors, load and check state dicts, and read/write safetensors files.

A model is any object graph: its Tensor attributes (and those in lists, tuples, dicts and nested objects) are its
state, keyed by attribute path (`layers.0.weight`), the same keys PyTorch uses for the same structure.

safetensors layout: an 8-byte little-endian header length N, N bytes of JSON header mapping each tensor name to
`{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the data that follows the header; an optional
`__metadata__` entry holds string pairs), then the raw little-endian data. `safe_load` memory-maps the file through the
DISK device: each tensor is a lazy copy of its own byte range, read only when the tensor is realized.
"""
from __future__ import annotations
import json
import math
import os
import struct
from typing import Any
from ember.device.base import Buffer
from ember.dtype import DType, dtypes, strong_dtype
from ember.errors import EmberError
from ember.schedule import attach_buffer, buffer_of
from ember.tensor import Tensor
from ember.uop.ops import BufferArg, Ops, UOp, next_unique
from ember.nn.functional import static_shape

class StateDictError(EmberError, ValueError):
  """A state dict does not fit the model: missing, unexpected, mis-shaped or mis-typed keys."""

class SafetensorsError(EmberError, ValueError):
  """A safetensors file is truncated, corrupt or uses a dtype ember does not know."""

# ** model state **

def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from `obj` through attributes, lists, tuples and dicts, keyed by its path.

  >>> from ember.nn import Linear
  >>> sorted(get_state_dict(Linear(2, 3)))
  ['bias', 'weight']
  """
  out: dict[str, Tensor] = {}
  _collect(obj, prefix, out, set())
  return out

def _collect(obj: Any, prefix: str, out: dict[str, Tensor], path: set[int]) -> None:
  if isinstance(obj, Tensor):
    out[prefix.rstrip(".")] = obj
    return
  # `path` holds the objects above this one: a cycle stops there, while an object shared by two paths appears under both
  if id(obj) in path or isinstance(obj, (str, bytes, int, float, bool, type(None))): return
  if isinstance(obj, dict): items: Any = obj.items()
  elif isinstance(obj, (list, tuple)): items = enumerate(obj)
  elif hasattr(obj, "__dict__") and not isinstance(obj, type): items = vars(obj).items()
  else: return
  path.add(id(obj))
  for key, value in items: _collect(value, f"{prefix}{key}.", out, path)
  path.discard(id(obj))

def get_parameters(obj: Any) -> list[Tensor]:
  """The model's tensors (parameters and buffers such as BatchNorm running statistics), each once, in key order."""
  unique: dict[int, Tensor] = {}
  for t in get_state_dict(obj).values(): unique.setdefault(id(t), t)
  return list(unique.values())

def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, cast: bool = False,
                    realize: bool = True) -> None:
  """Point each of the model's tensors at the matching entry of `state_dict` (moved to the tensor's device).

  Every problem is collected and raised together in one `StateDictError`: keys the model has that the dict lacks
  (missing) and keys the dict has that the model lacks (unexpected), when `strict`; shape mismatches always; dtype
  mismatches unless `cast=True`. With `realize` the values are read (from disk, for a `safe_load` dict) right away.

  >>> from ember.nn import Linear
  >>> a, b = Linear(2, 3), Linear(2, 3)
  >>> load_state_dict(b, get_state_dict(a))
  """
  model_sd = get_state_dict(model)
  problems: list[str] = []
  if strict:
    if missing := [k for k in model_sd if k not in state_dict]:
      problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected := [k for k in state_dict if k not in model_sd]:
      problems.append(f"unexpected keys: {', '.join(unexpected)}")
  shared = [k for k in model_sd if k in state_dict]
  for k in shared:
    have, got = model_sd[k], state_dict[k]
    if have.shape != got.shape: problems.append(f"{k}: shape {got.shape} in the state dict, {have.shape} in the model")
    elif have.dtype is not got.dtype and not cast:
      problems.append(f"{k}: dtype {got.dtype!r} in the state dict, {have.dtype!r} in the model "
                      "(pass cast=True to convert)")
  if problems:
    keys_differ = any(p.startswith(("missing", "unexpected")) for p in problems)
    fix = "\n(pass strict=False to load only the keys both have)" if strict and keys_differ else ""
    raise StateDictError(f"load_state_dict: the state dict does not fit {type(model).__name__}:\n  "
                         + "\n  ".join(problems) + fix)
  loaded = []
  for k in shared:
    target, value = model_sd[k], state_dict[k]
    value = value.to(target.device).cast(target.dtype)
    target.replace(value if _is_buffer(value) else value.contiguous())
    loaded.append(target)
  if realize and loaded: Tensor.realize(*loaded)

def _is_buffer(t: Tensor) -> bool:
  u = t.uop
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER

# ** safetensors **

SAFETENSORS_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
  "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64,
  "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
  "F8_E4M3": dtypes.fp8e4m3, "F8_E5M2": dtypes.fp8e5m2,
}
_DTYPE_NAMES = {dt: name for name, dt in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit

def safe_load_metadata(path: str) -> tuple[dict[str, Any], int, dict[str, str]]:
  """Parse and check a safetensors header: (tensor entries by name, byte offset of the data, `__metadata__`)."""
  try: size = os.path.getsize(path)
  except OSError as e: raise SafetensorsError(f"cannot open safetensors file {path!r}: {e.strerror}") from e
  if size < 8:
    raise SafetensorsError(f"{path}: {size} bytes is too short for a safetensors file "
                           "(no 8-byte header length at offset 0)")
  with open(path, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    if header_len > min(size - 8, _MAX_HEADER):
      raise SafetensorsError(f"{path}: header length {header_len} at offset 0 runs past the end of the file "
                             f"({size} bytes); "
                             "the file is truncated or not safetensors")
    raw = f.read(header_len)
  try: header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise SafetensorsError(f"{path}: the JSON header at offset 8 ({header_len} bytes) does not parse: {e}") from e
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: the header at offset 8 must be a JSON object, got {type(header).__name__}")
  metadata = header.pop("__metadata__", None) or {}
  data_start = 8 + header_len
  data_size = size - data_start
  for name, info in header.items(): _check_entry(path, name, info, data_start, data_size)
  return header, data_start, metadata

def _check_entry(path: str, name: str, info: Any, data_start: int, data_size: int) -> None:
  if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
    raise SafetensorsError(f"{path}: header entry {name!r} needs dtype, shape and data_offsets, got {info!r}")
  if info["dtype"] not in SAFETENSORS_DTYPES:
    raise SafetensorsError(f"{path}: tensor {name!r} has dtype {info['dtype']!r}, which ember cannot read; "
                           f"known: {', '.join(SAFETENSORS_DTYPES)}")
  shape, offsets = info["shape"], info["data_offsets"]
  if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
    raise SafetensorsError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
  ints = isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
  if not (ints and 0 <= offsets[0] <= offsets[1]):
    raise SafetensorsError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
  expected = math.prod(shape) * SAFETENSORS_DTYPES[info["dtype"]].itemsize
  if offsets[1] - offsets[0] != expected:
    raise SafetensorsError(f"{path}: tensor {name!r} ({info['dtype']} {shape}) needs {expected} bytes, "
                           f"but data_offsets {offsets} span {offsets[1] - offsets[0]}")
  if offsets[1] > data_size:
    raise SafetensorsError(f"{path}: tensor {name!r} ends at offset {data_start + offsets[1]}, "
                           "past the end of the file "
                           f"({data_start + data_size} bytes); the file is truncated")

def safe_load(path: str, device: str | None = None) -> dict[str, Tensor]:
  """The tensors of a safetensors file, lazily: each is a copy of its bytes from the memory-mapped file to `device`
  (the default device when None; `"disk"` keeps them on the file itself), done when the tensor is realized.

  >>> weights = safe_load("model.safetensors")  # doctest: +SKIP
  >>> weights["fc.weight"].numpy()  # doctest: +SKIP
  """
  header, data_start, _ = safe_load_metadata(path)
  disk = f"disk:{os.path.abspath(path)}"
  base = Buffer(disk, os.path.getsize(path), dtypes.uint8)
  out: dict[str, Tensor] = {}
  for name, info in header.items():
    dt = SAFETENSORS_DTYPES[info["dtype"]]
    begin, end = info["data_offsets"]
    count = (end - begin) // dt.itemsize
    uop = UOp(Ops.BUFFER, dt, (), BufferArg(next_unique(), disk, count))
    attach_buffer(uop, Buffer(disk, count, dt, base=base, offset=data_start + begin))
    t = Tensor(uop).reshape(tuple(info["shape"]))
    out[name] = t if device == "disk" else t.to(device)
  return out

def safe_save(tensors: dict[str, Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
  """Write `tensors` to a safetensors file (names sorted, the header padded with spaces to 8 bytes as the reference
  implementation pads it)."""
  entries: dict[str, Any] = {}
  blobs: list[bytes] = []
  offset = 0
  for name in sorted(tensors):
    t = tensors[name]
    dt = strong_dtype(t.dtype)
    if dt not in _DTYPE_NAMES:
      raise SafetensorsError(f"safe_save: tensor {name!r} has dtype {dt!r}, which safetensors cannot store")
    blob = _raw_bytes(t.cast(dt))
    shape = list(static_shape(t, "safe_save"))
    entries[name] = {"dtype": _DTYPE_NAMES[dt], "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
  if metadata:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
      raise SafetensorsError("safe_save: metadata must map str to str")
    entries = {"__metadata__": dict(metadata), **entries}
  header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
  header += b" " * (-len(header) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    for blob in blobs: f.write(blob)

def _raw_bytes(t: Tensor) -> bytes:
  """The tensor's elements as stored (bf16 and fp8 as their raw bits), row-major."""
  if math.prod(static_shape(t, "safe_save")) == 0: return b""
  src = t if _is_buffer(t) else t.contiguous()
  src.realize()
  return buffer_of(src.uop).numpy().tobytes()

__all__ = ["StateDictError", "SafetensorsError", "get_state_dict", "get_parameters", "load_state_dict",
           "safe_load_metadata", "safe_load", "safe_save", "SAFETENSORS_DTYPES"]
