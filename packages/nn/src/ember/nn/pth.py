"""PyTorch checkpoints (`torch.save` zip files, `.pth`/`.pt`) read without torch and without running their pickle.

A checkpoint is a zip archive `<name>/data.pkl` + `<name>/data/<key>` (one raw little-endian storage per key) +
`<name>/byteorder` + `<name>/version`. The pickle names the functions that rebuild its objects; a normal unpickler
would import and call whatever it names, so an untrusted file could run any code. `RestrictedUnpickler` maps the few
globals a checkpoint of tensors needs (`torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`, the `torch.*Storage`
classes, `collections.OrderedDict`) to ember's own functions and refuses everything else with `PickleSecurityError`
before anything is called; the pickle's opcodes are walked first, so that no length or memo index it declares sizes
an allocation. The archive around it is checked as torch's own reader checks it (`_check_archive`), and every
malformed file raises `CheckpointError` with the file, member and offset. Storages are read lazily through the DISK
device, as `safe_load` reads safetensors.

>>> state = torch_load("model.pth")  # doctest: +SKIP
>>> state["fc.weight"].shape  # doctest: +SKIP
(10, 784)
"""
from __future__ import annotations
import collections
import io
import lzma
import math
import os
import pickle
import pickletools
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np
from ember import Tensor
from ember.dtype import DType, dtypes
from ember.nn.weightfile import INT64_MAX, WeightFormatError, check_disjoint, check_shape

class CheckpointError(WeightFormatError):
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
MAX_NESTING = 100  # containers inside containers in the unpickled object (a state dict nests 2-5 deep)
MAX_INFLATION = 1100  # decompressed bytes per compressed byte a zip member may declare (deflate's limit is ~1032)
_UNSUPPORTED_FLAGS = 0x1 | 0x20 | 0x40 | 0x2000  # zip flags: encrypted, patch data, strong/directory encryption
MAX_FORMAT_VERSION = 10  # the newest archive format torch 2.x reads

# what a corrupt zip archive or pickle stream makes the standard library raise; each is re-raised as CheckpointError
# with the file, the member and the offset
_CORRUPT = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, EOFError, OSError,
            NotImplementedError, OverflowError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            struct.error, pickle.UnpicklingError)

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

def _int_tuple(where: str, field: str, value: Any) -> tuple[int, ...]:
  if not isinstance(value, (tuple, list)) or not all(type(v) is int for v in value):
    raise CheckpointError(f"{where}: the tensor's {field} must be a tuple of integers, got {value!r:.200}")
  return tuple(value)

def _rebuild_tensor(where: str, storage: Any, offset: Any, size: Any, stride: Any, *_ignored: Any) -> Tensor:
  """A lazy view of `storage` with torch's (offset, size, stride): a slice, reshape and permute when the strides are a
  permutation of a contiguous layout (plain and transposed tensors), else a gather (expanded or overlapping views)."""
  if not isinstance(storage, Storage):
    raise CheckpointError(f"{where}: a tensor is rebuilt from {type(storage).__name__}, not from a storage")
  if type(offset) is not int or offset < 0:
    raise CheckpointError(f"{where}: the tensor's storage offset must be an integer >= 0, got {offset!r:.50}")
  size = check_shape(CheckpointError, f"{where}: field size of a tensor", _int_tuple(where, "size", size),
                     storage.dtype.itemsize)
  stride = _int_tuple(where, "stride", stride)
  if len(stride) != len(size) or any(st < 0 for st in stride):
    raise CheckpointError(f"{where}: the tensor's stride {stride} does not fit its size {size} (one stride >= 0 per "
                          "dimension)")
  numel = math.prod(size)
  if numel == 0: return Tensor.zeros(*size, dtype=storage.dtype, device=storage.flat.device)
  extent = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1
  if extent > storage.flat.shape[0]:
    raise CheckpointError(f"{where}: tensor of size {size}, stride {stride}, offset {offset} reaches element {extent} "
                          f"of storage {storage.key!r}, which holds {storage.flat.shape[0]} elements")
  order = sorted(range(len(size)), key=lambda d: -stride[d])
  permuted = tuple(size[d] for d in order)
  expected = tuple(math.prod(permuted[i + 1:]) for i in range(len(permuted)))
  if all(permuted[i] == 1 or stride[d] == expected[i] for i, d in enumerate(order)):
    view = storage.flat[offset:offset + numel].reshape(permuted)
    return view.permute(tuple(order.index(d) for d in range(len(size)))) if order != list(range(len(size))) else view
  # a general strided view: gather each element by its flat index, offset + sum(i_d * stride_d)
  index_dtype = dtypes.int32 if extent < 2**31 else dtypes.int64
  index = Tensor.full(size, offset, dtype=index_dtype, device=storage.flat.device)
  for d, (s, st) in enumerate(zip(size, stride)):
    index = index + Tensor.arange(s, dtype=index_dtype, device=storage.flat.device).reshape(
      tuple(s if i == d else 1 for i in range(len(size)))) * st
  return storage.flat[index]

def _rebuild_tensor_v1(where: str, storage: Any, offset: Any, size: Any, stride: Any) -> Tensor:
  return _rebuild_tensor(where, storage, offset, size, stride)

def _rebuild_parameter(where: str, data: Any, requires_grad: Any, backward_hooks: Any, *_state: Any) -> Tensor:
  if not isinstance(data, Tensor):
    raise CheckpointError(f"{where}: a parameter is rebuilt from {type(data).__name__}, not from a tensor")
  return data

@dataclass(frozen=True)
class Rebuild:
  """A tensor-rebuild function the pickle may call; it gets the pickle's position first, for its errors."""
  fn: Callable[..., Tensor]

# (module, name) -> what the restricted unpickler hands back; nothing else can be named
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
  ("torch._utils", "_rebuild_tensor_v2"): Rebuild(_rebuild_tensor),
  ("torch._utils", "_rebuild_tensor"): Rebuild(_rebuild_tensor_v1),
  ("torch._utils", "_rebuild_parameter"): Rebuild(_rebuild_parameter),
  ("torch._utils", "_rebuild_parameter_with_state"): Rebuild(_rebuild_parameter),
  ("collections", "OrderedDict"): collections.OrderedDict,
  **{("torch", name): StorageType(name, dt) for name, dt in STORAGE_DTYPES.items()},
}

class RestrictedUnpickler(pickle.Unpickler):
  """An unpickler that resolves only `SAFE_GLOBALS` and loads persistent storage ids with `load_storage`."""
  def __init__(self, data: bytes, where: str, load_storage: Callable[[StorageType, str, int], Storage]):
    self.stream = io.BytesIO(data)
    super().__init__(self.stream)
    self.where, self.load_storage = where, load_storage
  def here(self) -> str: return f"{self.where} at offset {self.stream.tell()}"
  def find_class(self, module: str, name: str) -> Any:
    target = SAFE_GLOBALS.get((module, name))
    if target is None:
      raise PickleSecurityError(f"{self.here()}: the pickle refers to {module}.{name}, which is not a tensor-rebuild "
                                "global; refusing to load it (nothing was executed). Only load checkpoints you trust "
                                "with torch.load, or re-save the tensors as safetensors")
    if isinstance(target, Rebuild): return lambda *args: target.fn(self.here(), *args)
    return target
  def persistent_load(self, pid: Any) -> Any:
    ok = isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)
    if not (ok and isinstance(pid[2], (str, int)) and type(pid[4]) is int and 0 <= pid[4] <= INT64_MAX):
      raise CheckpointError(f"{self.here()}: unknown persistent id {pid!r:.200}; expected ('storage', <torch storage "
                            "type>, key, location, numel >= 0)")
    return self.load_storage(pid[1], str(pid[2]), pid[4])

def _check_pickle(data: bytes, where: str) -> None:
  """Walk the pickle's opcodes before running it: every length it declares lies inside the data (the C unpickler
  allocates a declared length before reading it) and every memo index is below the data's size (the memo is grown
  to the largest index)."""
  stream = io.BytesIO(data)
  pos = 0  # where the opcode being read starts
  try:
    for opcode, arg, at in pickletools.genops(stream):
      if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and not (isinstance(arg, int) and 0 <= arg < len(data)):
        raise CheckpointError(f"{where}: memo index {arg!r:.50} at offset {at} is out of range for a "
                              f"{len(data)}-byte pickle")
      pos = stream.tell()
  except CheckpointError: raise
  except (ValueError, OverflowError, struct.error) as e:  # pickletools' truncated arguments and unknown opcodes
    raise CheckpointError(f"{where}: corrupt pickle at offset {pos}: {e}") from e

def _check_nesting(obj: Any, where: str) -> None:
  """Refuse containers nested deeper than MAX_NESTING (code that walks the result recursively would overflow)."""
  stack, seen = [(obj, 0)], set()
  while stack:
    item, depth = stack.pop()
    if not isinstance(item, (dict, list, tuple, set, frozenset)) or id(item) in seen: continue
    if depth >= MAX_NESTING:
      raise CheckpointError(f"{where}: the pickled object nests containers deeper than {MAX_NESTING} levels")
    seen.add(id(item))
    children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
    stack.extend((child, depth + 1) for child in children)

def _name_bytes(info: zipfile.ZipInfo) -> bytes:
  return info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")

def _member_data_offset(raw: io.BufferedReader, info: zipfile.ZipInfo, path: str) -> int:
  """Where a member's bytes start: after its local header (whose extra field, the alignment padding torch writes, can
  differ from the central directory's), which must agree with the central directory on name, method and sizes."""
  where = f"{path}: the local header of {info.filename!r} at offset {info.header_offset}"
  if not 0 <= info.header_offset <= raw.seek(0, os.SEEK_END) - 30: raise CheckpointError(f"{where} is outside the file")
  raw.seek(info.header_offset)
  header = raw.read(30)
  if header[:4] != b"PK\x03\x04": raise CheckpointError(f"{where} is corrupt (no local header signature)")
  flags, method, crc, packed, unpacked, name_len, extra_len = struct.unpack("<2xHH4xIIIHH", header[4:30])
  if raw.read(name_len) != _name_bytes(info):
    raise CheckpointError(f"{where} names another member than the central directory does")
  sizes_differ = (crc, packed, unpacked) != (info.CRC, info.compress_size, info.file_size) and 0xFFFFFFFF not in (
    packed, unpacked)
  if method != info.compress_type or (not flags & 0x8 and sizes_differ):
    raise CheckpointError(f"{where} disagrees with the central directory on the compression method, CRC or sizes")
  start = info.header_offset + 30 + name_len + extra_len
  if start + info.compress_size > raw.seek(0, os.SEEK_END):
    raise CheckpointError(f"{where}: the member's {info.compress_size} bytes from offset {start} run past the end of "
                          "the file; the file is truncated")
  return start

def _check_end_record(fpath: str, raw: io.BufferedReader, size: int, infos: list[zipfile.ZipInfo]) -> None:
  """The end-of-central-directory record (and the zip64 record and locator torch always writes before it) are on one
  disk and count every entry, and the central directory they locate ends where they start, its entries' declared
  lengths adding up to its size."""
  raw.seek(max(0, size - 65557))  # 22 bytes and a comment of at most 65535
  tail = raw.read()
  end = tail.rfind(b"PK\x05\x06")
  if end < 0 or len(tail) < end + 22: raise CheckpointError(f"{fpath}: no end-of-central-directory record")
  at = size - len(tail) + end
  where = f"{fpath}: the end record at offset {at}"
  disk, cd_disk, on_disk, total, cd_size, cd_offset = struct.unpack("<HHHHII", tail[end + 4:end + 20])
  ends = at
  if end >= 20 and tail[end - 20:end - 16] == b"PK\x06\x07":
    z_disk, z_at, n_disks = struct.unpack("<IQI", tail[end - 16:end])
    raw.seek(min(z_at, size))
    record = raw.read(56)
    if record[:4] != b"PK\x06\x06" or len(record) < 56 or z_at + 12 + struct.unpack("<Q", record[4:12])[0] != at - 20:
      raise CheckpointError(f"{where}: the zip64 locator points at offset {z_at}, where no zip64 record ends at the "
                            "locator")
    z = struct.unpack("<IIQQQQ", record[16:56])
    narrow = (disk, cd_disk, on_disk, total, cd_size, cd_offset)
    if any(n not in (w, 0xFFFF, 0xFFFFFFFF) for n, w in zip(narrow, z)) or z_disk or n_disks != 1:
      raise CheckpointError(f"{where}: the zip64 record at offset {z_at} {z} disagrees with it {narrow}")
    disk, cd_disk, on_disk, total, cd_size, cd_offset = z
    ends = z_at
  if disk or cd_disk: raise CheckpointError(f"{where} describes a multi-disk archive (disks {disk}, {cd_disk})")
  if not on_disk == total == len(infos) or cd_offset + cd_size != ends:
    raise CheckpointError(f"{where} counts {on_disk}/{total} entries in {cd_size} bytes at offset {cd_offset}; the "
                          f"central directory holds {len(infos)} and ends at offset {ends}")
  raw.seek(cd_offset)
  directory, pos, count = raw.read(cd_size), 0, 0
  while pos < len(directory):
    if directory[pos:pos + 4] != b"PK\x01\x02" or pos + 46 > len(directory):
      raise CheckpointError(f"{fpath}: central directory entry #{count} at offset {cd_offset + pos} is corrupt")
    pos += 46 + sum(struct.unpack("<HHH", directory[pos + 28:pos + 34]))
    count += 1
  if pos != len(directory) or count != len(infos):
    raise CheckpointError(f"{fpath}: the central directory's entries at offset {cd_offset} declare lengths that do "
                          f"not add up to its {cd_size} bytes")

def _open_archive(fpath: str) -> tuple[zipfile.ZipFile, int]:
  try: size = os.path.getsize(fpath)
  except OSError as e: raise CheckpointError(f"cannot read checkpoint {fpath!r}: {e}") from e
  try: archive = zipfile.ZipFile(fpath)
  except zipfile.BadZipFile as e:
    with open(fpath, "rb") as f: head = f.read(4)
    if head[:2] == b"\x80\x02" or head[:1] == b"\x80":
      raise CheckpointError(f"{fpath}: a legacy (pre-1.6, non-zip) torch checkpoint, which this reader does not "
                            "handle; re-save it with a current torch.save") from e
    raise CheckpointError(f"{fpath}: not a zip checkpoint or truncated ({size} bytes; no end-of-central-directory "
                          f"record found before offset {size}): {e}") from e
  except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
    raise CheckpointError(f"cannot read checkpoint {fpath!r}: {e}") from e
  except _CORRUPT as e:
    raise CheckpointError(f"{fpath}: corrupt zip central directory (before offset {size}): "
                          f"{type(e).__name__}: {e}") from e
  return archive, size

def _check_archive(fpath: str, archive: zipfile.ZipFile, raw: io.BufferedReader, size: int
                   ) -> tuple[dict[str, zipfile.ZipInfo], str]:
  """The archive's members by name and the folder they are in, after checking its structure as torch's reader does:
  one folder holding everything, one data.pkl, unique names, an end record counting every entry, each member stored or
  deflated (never encrypted) behind a local header that names it, a `version` torch reads, a little-endian byteorder."""
  infos = archive.infolist()
  names = [i.filename for i in infos]
  if len(set(names)) != len(names):
    dup = next(i for i in infos if names.count(i.filename) > 1)
    raise CheckpointError(f"{fpath}: the archive holds member {dup.filename!r} (local header at offset "
                          f"{dup.header_offset}) more than once; member names must be unique")
  pickles = [n for n in names if n.endswith("/data.pkl")]
  if len(pickles) != 1:
    scripted = any(n.endswith("constants.pkl") for n in names)
    hint = " (a TorchScript archive: load it with torch.jit)" if scripted else ""
    raise CheckpointError(f"{fpath}: expected one <folder>/data.pkl in the archive (central directory at offset "
                          f"{archive.start_dir}), found {len(pickles)}{hint}")
  prefix = pickles[0][:-len("data.pkl")]
  if prefix.count("/") != 1:
    raise CheckpointError(f"{fpath}: data.pkl must be in a folder at the top of the archive, found {pickles[0]!r}")
  if stray := [i for i in infos if not i.filename.startswith(prefix)]:
    raise CheckpointError(f"{fpath}: every member must be in the folder {prefix!r}, which holds data.pkl; found "
                          f"{stray[0].filename!r} (local header at offset {stray[0].header_offset})")
  _check_end_record(fpath, raw, size, infos)
  for info in infos:
    where = f"{fpath}: member {info.filename!r} (local header at offset {info.header_offset})"
    try: _name_bytes(info).decode("utf-8")
    except UnicodeDecodeError as e: raise CheckpointError(f"{where}: the name is not UTF-8") from e
    if info.volume: raise CheckpointError(f"{where} is on disk {info.volume} of a multi-disk archive")
    if info.is_dir() or info.external_attr & 0x10:
      raise CheckpointError(f"{where} is marked as a directory, which holds no data")
    if info.flag_bits & _UNSUPPORTED_FLAGS:
      raise CheckpointError(f"{where} has zip flags {info.flag_bits:#x} (encryption or patch data), which torch "
                            "never writes")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
      raise CheckpointError(f"{where} uses compression method {info.compress_type}; only stored and deflated "
                            "members are read")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
      raise CheckpointError(f"{where} is stored but declares {info.file_size} bytes for {info.compress_size}")
    _member_data_offset(raw, info, fpath)
  members = {i.filename: i for i in infos}
  if f"{prefix}version" not in members:
    raise CheckpointError(f"{fpath}: the archive has no {prefix}version member; it is not a torch.save checkpoint")
  version = _read_member(archive, members[f"{prefix}version"], fpath, size)
  match = re.match(rb"\s*([+-]?\d{1,9})", version)
  if match is None or not 1 <= int(match.group(1)) <= MAX_FORMAT_VERSION:
    at = members[f"{prefix}version"].header_offset
    raise CheckpointError(f"{fpath}: {prefix}version (local header at offset {at}) holds {version[:20]!r}; torch "
                          f"writes format versions 1..{MAX_FORMAT_VERSION}")
  if f"{prefix}byteorder" in members:
    order = _read_member(archive, members[f"{prefix}byteorder"], fpath, size)
    if order != b"little":
      raise CheckpointError(f"{fpath}: {prefix}byteorder holds {order[:20]!r}: a big-endian or corrupt checkpoint; "
                            "re-save it on a little-endian machine")
  if f"{prefix}.data/serialization_id" in members:
    try: _read_member(archive, members[f"{prefix}.data/serialization_id"], fpath, size).decode("utf-8")
    except UnicodeDecodeError as e:
      raise CheckpointError(f"{fpath}: {prefix}.data/serialization_id is not UTF-8 text") from e
  if f"{prefix}.storage_alignment" in members:
    alignment = _read_member(archive, members[f"{prefix}.storage_alignment"], fpath, size)
    if re.fullmatch(rb"\s*\d{1,9}\s*", alignment) is None:
      raise CheckpointError(f"{fpath}: {prefix}.storage_alignment holds {alignment[:20]!r}, not a number")
  return members, prefix

def torch_load(path: str | os.PathLike[str], device: str | None = None) -> Any:
  """The object a `torch.save` zip checkpoint holds (usually a state dict), its tensors as lazy ember Tensors on
  `device`; a pickle naming anything but tensor-rebuild globals raises `PickleSecurityError` without executing it.
  Any other malformed file raises `CheckpointError` (a `WeightFormatError`) naming the file, member and offset."""
  fpath = os.fspath(path)
  archive, size = _open_archive(fpath)
  with archive, open(fpath, "rb") as raw:
    members, prefix = _check_archive(fpath, archive, raw, size)
    storages: dict[str, Storage] = {}
    ranges: list[tuple[str, int, int]] = []

    def load_storage(stype: StorageType, key: str, numel: int) -> Storage:
      if key in storages: return storages[key]
      member = f"{prefix}data/{key}"
      if member not in members: raise CheckpointError(f"{fpath}: storage {key!r} is missing (no member {member!r})")
      info = members[member]
      need = numel * stype.dtype.itemsize
      if info.file_size < need:
        raise CheckpointError(f"{fpath}: storage {member!r} (local header at offset {info.header_offset}) holds "
                              f"{info.file_size} bytes, {stype.name} of {numel} elements needs {need}")
      if numel == 0: flat = Tensor.zeros(0, dtype=stype.dtype, device=device)
      elif info.compress_type == zipfile.ZIP_STORED:
        start = _member_data_offset(raw, info, fpath)
        if start + need > size or need > info.compress_size:
          raise CheckpointError(f"{fpath}: storage {member!r} spans bytes {start}..{start + need}, past the end of "
                                f"its member or of the file at offset {size}; the file is truncated")
        ranges.append((member, start, start + need))
        flat = Tensor.from_file(fpath, start, (numel,), stype.dtype, device)
      else:
        data = _read_member(archive, info, fpath, size)[:need]
        flat = Tensor(np.frombuffer(data, dtype=np.uint8).copy(), device=device).bitcast(stype.dtype)
      storages[key] = Storage(key, stype.dtype, flat)
      return storages[key]

    where = f"{fpath}:{prefix}data.pkl"
    data = _read_member(archive, members[f"{prefix}data.pkl"], fpath, size)
    _check_pickle(data, where)
    unpickler = RestrictedUnpickler(data, where, load_storage)
    try: obj = unpickler.load()
    except CheckpointError: raise
    except _CORRUPT as e:
      raise CheckpointError(f"{where}: corrupt pickle at offset {unpickler.stream.tell()}: "
                            f"{type(e).__name__}: {e}") from e
    _check_nesting(obj, where)
    check_disjoint(CheckpointError, fpath, ranges, "storage")
  return obj

def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, fpath: str, size: int) -> bytes:
  """A member's bytes, after checking the size it declares against the file (a stored member's bytes are in the file;
  a compressed one inflates at most MAX_INFLATION-fold)."""
  limit = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else MAX_INFLATION)
  if info.compress_size > size or info.file_size > limit:
    raise CheckpointError(f"{fpath}: member {info.filename!r} (local header at offset {info.header_offset}) declares "
                          f"{info.file_size} bytes from {info.compress_size} stored in a {size}-byte file")
  try: return archive.read(info)
  except _CORRUPT as e:
    raise CheckpointError(f"{fpath}: member {info.filename!r} at offset {info.header_offset} is corrupt or truncated: "
                          f"{type(e).__name__}: {e}") from e

__all__ = ["CheckpointError", "PickleSecurityError", "RestrictedUnpickler", "SAFE_GLOBALS", "STORAGE_DTYPES",
           "torch_load"]
