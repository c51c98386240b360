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
from ember import Tensor
from ember.dtype import DType, dtypes, strong_dtype
from ember.errors import EmberError
from ember.nn.functional import static_shape
from ember.nn.weightfile import WeightFormatError, check_disjoint, check_shape

class StateDictError(EmberError, ValueError):
  """A state dict does not fit the model: missing, unexpected, mis-shaped or mis-typed keys."""

class SafetensorsError(WeightFormatError):
  """A safetensors file is truncated, corrupt, inconsistent or uses a dtype ember does not know."""

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
    target.replace(value if value.is_realized else value.contiguous())
    loaded.append(target)
  if realize and loaded: Tensor.realize(*loaded)

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
  """Parse and check a safetensors header: (tensor entries by name, byte offset of the data, `__metadata__`).

  As the reference implementation requires, the tensors' byte ranges tile the data section exactly (no overlap, no
  gap, nothing after the last); names must also be unique (JSON would silently keep the last of two)."""
  try: size = os.path.getsize(path)
  except OSError as e: raise SafetensorsError(f"cannot open safetensors file {path!r}: {e.strerror}") from e
  if size < 8:
    raise SafetensorsError(f"{path}: {size} bytes is too short for a safetensors file "
                           "(no 8-byte header length at offset 0)")
  try:
    with open(path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      if header_len > min(size - 8, _MAX_HEADER):
        raise SafetensorsError(f"{path}: header length {header_len} at offset 0 runs past the end of the file "
                               f"({size} bytes) or over the {_MAX_HEADER}-byte limit; the file is truncated or not "
                               "safetensors")
      raw = f.read(header_len)
  except OSError as e: raise SafetensorsError(f"cannot read safetensors file {path!r}: {e.strerror}") from e
  header = _parse_header(path, raw)
  metadata = header.pop("__metadata__", None)
  if metadata is None: metadata = {}
  if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
    raise SafetensorsError(f"{path}: __metadata__ at offset {_offset_of(raw, '__metadata__')} must map strings to "
                           f"strings, got {metadata!r:.200}")
  data_start = 8 + header_len
  data_size = size - data_start
  for name, info in header.items(): _check_entry(path, raw, name, info, data_size)
  _check_tiling(path, header, data_start, data_size)
  return header, data_start, metadata

def _parse_header(path: str, raw: bytes) -> dict[str, Any]:
  def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
      if key in out:
        raise SafetensorsError(f"{path}: the JSON header names {key!r} twice (first at offset "
                               f"{_offset_of(raw, key)}); each tensor name must be unique")
      out[key] = value
    return out
  try: header = json.loads(raw.decode("utf-8"), object_pairs_hook=unique)
  except SafetensorsError: raise
  except RecursionError as e:  # the parser's own nesting bound; a valid header nests three deep
    raise SafetensorsError(f"{path}: the JSON header at offset 8 ({len(raw)} bytes) nests too deeply") from e
  except ValueError as e:  # undecodable bytes, bad JSON, integers of more digits than Python converts
    raise SafetensorsError(f"{path}: the JSON header at offset 8 ({len(raw)} bytes) does not parse: {e}") from e
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: the header at offset 8 must be a JSON object, got {type(header).__name__}")
  return header

def _offset_of(raw: bytes, key: str) -> int:
  """The file offset of `key`'s first occurrence in the header (8 when it cannot be found as written)."""
  at = raw.find(json.dumps(key).encode("utf-8"))
  return 8 + max(at, 0)

def _check_entry(path: str, raw: bytes, name: str, info: Any, data_size: int) -> None:
  where = f"{path}: tensor {name!r} (header entry at offset {_offset_of(raw, name)})"
  if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
    raise SafetensorsError(f"{where} needs dtype, shape and data_offsets, got {info!r:.200}")
  dtype, offsets = info["dtype"], info["data_offsets"]
  if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
    raise SafetensorsError(f"{where} has dtype {dtype!r:.50}, which ember cannot read; known: "
                           f"{', '.join(SAFETENSORS_DTYPES)}")
  itemsize = SAFETENSORS_DTYPES[dtype].itemsize
  shape = check_shape(SafetensorsError, f"{where}, field shape", info["shape"], itemsize)
  ints = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
  if not (ints and 0 <= offsets[0] <= offsets[1]):
    raise SafetensorsError(f"{where} has invalid data_offsets {offsets!r:.200}; expected [begin, end] with "
                           "0 <= begin <= end")
  if offsets[1] > data_size:
    raise SafetensorsError(f"{where} ends at offset {8 + len(raw) + offsets[1]}, past the end of the file "
                           f"({8 + len(raw) + data_size} bytes); the file is truncated")
  expected = math.prod(shape) * itemsize
  if offsets[1] - offsets[0] != expected:
    raise SafetensorsError(f"{where} ({dtype} {list(shape)}) needs {expected} bytes, but data_offsets {offsets} span "
                           f"{offsets[1] - offsets[0]}")

def _check_tiling(path: str, header: dict[str, Any], data_start: int, data_size: int) -> None:
  ranges = [(name, *info["data_offsets"]) for name, info in header.items()]
  check_disjoint(SafetensorsError, path, [(n, data_start + b, data_start + e) for n, b, e in ranges])
  covered = 0
  for begin, end, name in sorted((b, e, n) for n, b, e in ranges):
    if begin != covered:
      raise SafetensorsError(f"{path}: tensor {name!r} starts at offset {data_start + begin}, but the tensors before "
                             f"it end at {data_start + covered}; the data ranges must leave no gap")
    covered = end
  if covered != data_size:
    raise SafetensorsError(f"{path}: the tensors' data ends at offset {data_start + covered}, but the file has "
                           f"{data_size - covered} more bytes up to offset {data_start + data_size}; the file is "
                           "corrupt or has trailing data")

def safe_load(path: str, device: str | None = None) -> dict[str, Tensor]:
  """The tensors of a safetensors file, lazily: each is a copy of its bytes from the memory-mapped file to `device`
  (the default device when None; `"disk"` keeps them on the file itself), done when the tensor is realized. A
  malformed file raises `SafetensorsError` (a `WeightFormatError`) before any tensor is made.

  >>> weights = safe_load("model.safetensors")  # doctest: +SKIP
  >>> weights["fc.weight"].numpy()  # doctest: +SKIP
  """
  header, data_start, _ = safe_load_metadata(path)
  return {name: Tensor.from_file(path, data_start + info["data_offsets"][0], tuple(info["shape"]),
                                 SAFETENSORS_DTYPES[info["dtype"]], device) for name, info in header.items()}

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
  return t.buffer().numpy().tobytes()

__all__ = ["StateDictError", "SafetensorsError", "get_state_dict", "get_parameters", "load_state_dict",
           "safe_load_metadata", "safe_load", "safe_save", "SAFETENSORS_DTYPES"]
