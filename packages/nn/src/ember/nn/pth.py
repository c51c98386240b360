"""PyTorch checkpoints (`torch.save` zip files, `.pth`/`.pt`) read without torch and without running their pickle.

A checkpoint is a zip archive `<name>/data.pkl` + `<name>/data/<key>` (one raw little-endian storage per key) +
`<name>/byteorder` + `<name>/version`. The pickle names the functions that rebuild its objects; a normal unpickler
would import and call whatever it names, so an untrusted file could run any code. `RestrictedUnpickler` maps the few
globals a checkpoint of tensors needs (`torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`, the `torch.*Storage`
classes, `collections.OrderedDict`) to ember's own functions and refuses everything else with `PickleSecurityError`
before anything is called. Storages are read lazily through the DISK device, as `safe_load` reads safetensors.

>>> state = torch_load("model.pth")  # doctest: +SKIP
>>> state["fc.weight"].shape  # doctest: +SKIP
(10, 784)
"""
from __future__ import annotations
import collections
import io
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np
from ember.device.base import Buffer
from ember.dtype import DType, dtypes
from ember.errors import EmberError
from ember.schedule import attach_buffer
from ember.tensor import Tensor
from ember.uop.ops import BufferArg, Ops, UOp, next_unique

class CheckpointError(EmberError, ValueError):
  """A PyTorch checkpoint is truncated, corrupt, or in a layout this reader does not handle."""

class PickleSecurityError(CheckpointError):
  """The checkpoint's pickle names a global outside the tensor-rebuild allow-list; nothing was executed."""

STORAGE_DTYPES: dict[str, DType] = {
  "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool,
  "UInt16Storage": dtypes.uint16, "UInt32Storage": dtypes.uint32, "UInt64Storage": dtypes.uint64,
  "Float8_e4m3fnStorage": dtypes.fp8e4m3, "Float8_e5m2Storage": dtypes.fp8e5m2, "UntypedStorage": dtypes.uint8,
}

@dataclass(frozen=True)
class StorageType:
  """What `torch.<Name>Storage` unpickles to: only its element type matters."""
  name: str
  dtype: DType

@dataclass(frozen=True)
class Storage:
  """One storage of the archive: a lazy flat Tensor over its bytes in the file."""
  key: str
  dtype: DType
  flat: Tensor

def _rebuild_tensor(storage: Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_ignored: Any) -> Tensor:
  """A lazy view of `storage` with torch's (offset, size, stride): a slice, reshape and permute when the strides are a
  permutation of a contiguous layout (plain and transposed tensors), else a gather (expanded or overlapping views)."""
  size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
  numel = math.prod(size)
  if numel == 0: return Tensor.zeros(*size, dtype=storage.dtype, device=storage.flat.device)
  extent = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1
  if offset < 0 or extent > storage.flat.shape[0]:
    raise CheckpointError(f"tensor of size {size}, stride {stride}, offset {offset} reaches element {extent} of "
                          f"storage {storage.key!r}, which holds {storage.flat.shape[0]} elements")
  order = sorted(range(len(size)), key=lambda d: -stride[d])
  permuted = tuple(size[d] for d in order)
  expected = tuple(math.prod(permuted[i + 1:]) for i in range(len(permuted)))
  if all(permuted[i] == 1 or stride[d] == expected[i] for i, d in enumerate(order)):
    view = storage.flat[offset:offset + numel].reshape(permuted)
    return view.permute(tuple(order.index(d) for d in range(len(size)))) if order != list(range(len(size))) else view
  # a general strided view: gather each element by its flat index, offset + sum(i_d * stride_d)
  index = Tensor.full(size, offset, dtype=dtypes.int32, device=storage.flat.device)
  for d, (s, st) in enumerate(zip(size, stride)):
    index = index + Tensor.arange(s, dtype=dtypes.int32, device=storage.flat.device).reshape(
      tuple(s if i == d else 1 for i in range(len(size)))) * st
  return storage.flat[index]

def _rebuild_tensor_v1(storage: Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> Tensor:
  return _rebuild_tensor(storage, offset, size, stride)

def _rebuild_parameter(data: Tensor, requires_grad: bool, backward_hooks: Any, *_state: Any) -> Tensor:
  return data

# (module, name) -> what the restricted unpickler hands back; nothing else can be named
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
  ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor, ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v1,
  ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
  ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
  ("collections", "OrderedDict"): collections.OrderedDict,
  **{("torch", name): StorageType(name, dt) for name, dt in STORAGE_DTYPES.items()},
}

class RestrictedUnpickler(pickle.Unpickler):
  """An unpickler that resolves only `SAFE_GLOBALS` and loads persistent storage ids with `load_storage`."""
  def __init__(self, data: bytes, where: str, load_storage: Callable[[StorageType, str, int], Storage]):
    self.stream = io.BytesIO(data)
    super().__init__(self.stream)
    self.where, self.load_storage = where, load_storage
  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in SAFE_GLOBALS: return SAFE_GLOBALS[(module, name)]
    raise PickleSecurityError(f"{self.where}: the pickle refers to {module}.{name} at offset {self.stream.tell()}, "
                              "which is not a tensor-rebuild global; refusing to load it (nothing was executed). "
                              "Only load checkpoints you trust with torch.load, or re-save the tensors as safetensors")
  def persistent_load(self, pid: Any) -> Any:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)):
      raise CheckpointError(f"{self.where}: unknown persistent id {pid!r} at offset {self.stream.tell()}; "
                            "expected ('storage', <torch storage type>, key, location, numel)")
    return self.load_storage(pid[1], str(pid[2]), int(pid[4]))

def _member_data_offset(raw: io.BufferedReader, info: zipfile.ZipInfo, path: str) -> int:
  """Where a stored member's bytes start: after its local header, whose extra field (alignment padding that torch
  writes) can differ from the central directory's."""
  raw.seek(info.header_offset)
  header = raw.read(30)
  if len(header) != 30 or header[:4] != b"PK\x03\x04":
    raise CheckpointError(f"{path}: corrupt zip local header for {info.filename!r} at offset {info.header_offset}")
  name_len, extra_len = struct.unpack("<HH", header[26:30])
  return info.header_offset + 30 + name_len + extra_len

def torch_load(path: str | os.PathLike[str], device: str | None = None) -> Any:
  """The object a `torch.save` zip checkpoint holds (usually a state dict), its tensors as lazy ember Tensors on
  `device`; a pickle naming anything but tensor-rebuild globals raises `PickleSecurityError` without executing it."""
  fpath = os.fspath(path)
  try:
    size = os.path.getsize(fpath)
    archive = zipfile.ZipFile(fpath)
  except OSError as e: raise CheckpointError(f"cannot read checkpoint {fpath!r}: {e}") from e
  except zipfile.BadZipFile as e:
    with open(fpath, "rb") as f: head = f.read(4)
    if head[:2] == b"\x80\x02" or head[:1] == b"\x80":
      raise CheckpointError(f"{fpath}: a legacy (pre-1.6, non-zip) torch checkpoint, which this reader does not "
                            "handle; re-save it with a current torch.save") from e
    raise CheckpointError(f"{fpath}: not a zip checkpoint or truncated ({size} bytes; no end-of-central-directory "
                          f"record found before offset {size}): {e}") from e
  with archive, open(fpath, "rb") as raw:
    names = archive.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pickles) != 1:
      scripted = any(n.endswith("constants.pkl") for n in names)
      hint = " (a TorchScript archive: load it with torch.jit)" if scripted else ""
      raise CheckpointError(f"{fpath}: expected one data.pkl in the archive, found {len(pickles)}{hint}")
    prefix = pickles[0][:-len("data.pkl")]
    if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder").strip() != b"little":
      raise CheckpointError(f"{fpath}: a big-endian checkpoint; re-save it on a little-endian machine")
    infos = {i.filename: i for i in archive.infolist()}
    storages: dict[str, Storage] = {}
    disk = f"disk:{os.path.abspath(fpath)}"
    base = Buffer(disk, size, dtypes.uint8)

    def load_storage(stype: StorageType, key: str, numel: int) -> Storage:
      if key in storages: return storages[key]
      member = f"{prefix}data/{key}"
      if member not in infos: raise CheckpointError(f"{fpath}: storage {key!r} is missing (no member {member!r})")
      info = infos[member]
      need = numel * stype.dtype.itemsize
      if info.file_size < need:
        raise CheckpointError(f"{fpath}: storage {member!r} holds {info.file_size} bytes, {stype.name} of {numel} "
                              f"elements needs {need}")
      if numel == 0: flat = Tensor.zeros(0, dtype=stype.dtype, device=device)
      elif info.compress_type == zipfile.ZIP_STORED:
        start = _member_data_offset(raw, info, fpath)
        if start + need > size:
          raise CheckpointError(f"{fpath}: storage {member!r} spans bytes {start}..{start + need}, past the end of "
                                f"the file at offset {size}; the file is truncated")
        uop = UOp(Ops.BUFFER, stype.dtype, (), BufferArg(next_unique(), disk, numel))
        attach_buffer(uop, Buffer(disk, numel, stype.dtype, base=base, offset=start))
        flat = Tensor(uop).to(device)
      else:
        data = _read_member(archive, member, fpath)[:need]
        flat = Tensor(np.frombuffer(data, dtype=np.uint8).copy(), device=device).bitcast(stype.dtype)
      storages[key] = Storage(key, stype.dtype, flat)
      return storages[key]

    where = f"{fpath}:{pickles[0]}"
    unpickler = RestrictedUnpickler(_read_member(archive, pickles[0], fpath), where, load_storage)
    try: obj = unpickler.load()
    except (EOFError, pickle.UnpicklingError, struct.error, IndexError, TypeError, KeyError, ValueError) as e:
      if isinstance(e, CheckpointError): raise
      raise CheckpointError(f"{where}: corrupt pickle at offset {unpickler.stream.tell()}: "
                            f"{type(e).__name__}: {e}") from e
  return obj

def _read_member(archive: zipfile.ZipFile, member: str, fpath: str) -> bytes:
  info = archive.getinfo(member)
  try: return archive.read(member)
  except (zipfile.BadZipFile, EOFError, OSError) as e:
    raise CheckpointError(f"{fpath}: member {member!r} at offset {info.header_offset} is corrupt or truncated: "
                          f"{e}") from e

__all__ = ["CheckpointError", "PickleSecurityError", "RestrictedUnpickler", "SAFE_GLOBALS", "STORAGE_DTYPES",
           "torch_load"]
