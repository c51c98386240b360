"""PyTorch zip checkpoints: files torch.save writes here, read without torch and without executing their pickle; a
malicious pickle must raise before running; corrupt and truncated files raise errors naming the file and offset."""
from __future__ import annotations
import io
import os
import pickle
import struct
import zipfile
from pathlib import Path
import numpy as np
import pytest
from ember import dtypes
from ember.nn.pth import CheckpointError, PickleSecurityError, torch_load

torch = pytest.importorskip("torch")

def _save(tmp_path: Path, obj, name: str = "ckpt.pth") -> str:
  path = str(tmp_path / name)
  torch.save(obj, path)
  return path

def test_state_dict_round_trip(tmp_path: Path):
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4, 3))
  sd = model.state_dict()
  loaded = torch_load(_save(tmp_path, sd))
  assert list(loaded) == list(sd)
  assert loaded._metadata == sd._metadata
  assert loaded["1.num_batches_tracked"].dtype is dtypes.int64
  assert not any(t.uop.is_realized for t in loaded.values())  # lazy: nothing read yet
  for k, v in sd.items(): np.testing.assert_array_equal(loaded[k].numpy(), v.numpy(), err_msg=k)

def test_dtypes_views_parameters_and_nesting(tmp_path: Path):
  g = torch.Generator().manual_seed(1)
  base = torch.randn(6, 5, generator=g)
  obj = {"f16": torch.randn(3, 4, generator=g).half(), "bf16": torch.randn(7, generator=g).bfloat16(),
         "i32": torch.arange(-4, 8, dtype=torch.int32).reshape(3, 4), "u8": torch.arange(250, 256, dtype=torch.uint8),
         "bool": torch.tensor([True, False, True]), "f64": torch.randn(2, 2, generator=g).double(),
         "transposed": base.t(), "slice": base[2:4, 1:], "expanded": torch.randn(3, 1, generator=g).expand(3, 4),
         "param": torch.nn.Parameter(torch.randn(2, 3, generator=g)), "scalar": torch.tensor(3.5),
         "list": [torch.ones(2), (torch.zeros(1), 7)], "meta": {"epoch": 3, "name": "run"}}
  loaded = torch_load(_save(tmp_path, obj))
  for k, v in obj.items():
    if not isinstance(v, torch.Tensor): continue
    ref = v.detach()
    got = loaded[k].float().numpy() if ref.dtype == torch.bfloat16 else loaded[k].numpy()
    assert got.shape == tuple(ref.shape), k
    np.testing.assert_array_equal(got, ref.float().numpy() if ref.dtype == torch.bfloat16 else ref.numpy(), err_msg=k)
  assert loaded["bf16"].dtype is dtypes.bfloat16 and loaded["f16"].dtype is dtypes.float16
  np.testing.assert_array_equal(loaded["list"][0].numpy(), np.ones(2, np.float32))
  assert loaded["list"][1][1] == 7 and loaded["meta"] == {"epoch": 3, "name": "run"}

class _Evil:
  def __reduce__(self): return (os.system, ("touch pwned",))

def _with_pickle(tmp_path: Path, payload: bytes) -> str:
  """A torch.save archive whose data.pkl is replaced by `payload`."""
  path = _save(tmp_path, {"w": torch.ones(2)}, "evil.pth")
  src = zipfile.ZipFile(path)
  out = str(tmp_path / "evil2.pth")
  with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
      dst.writestr(info.filename, payload if info.filename.endswith("data.pkl") else src.read(info.filename))
  return out

def test_malicious_pickle_raises_without_executing(tmp_path: Path, monkeypatch):
  payload = pickle.dumps({"w": _Evil()}, protocol=2)  # names os.system (posix.system) in a REDUCE
  monkeypatch.chdir(tmp_path)
  calls: list[str] = []
  monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))  # were it called, the test would see it
  with pytest.raises(PickleSecurityError, match=r"(posix|os)\.system") as e:
    torch_load(_with_pickle(tmp_path, payload))
  assert "evil2.pth" in str(e.value) and "offset" in str(e.value)
  assert calls == [] and not (tmp_path / "pwned").exists()
  builtin = pickle.dumps(eval, protocol=2)
  with pytest.raises(PickleSecurityError, match=r"__builtin__\.eval|builtins\.eval"):
    torch_load(_with_pickle(tmp_path, builtin))

def test_corrupt_and_truncated_files(tmp_path: Path):
  path = Path(_save(tmp_path, {"w": torch.randn(64, 64)}))
  data = path.read_bytes()
  cut = tmp_path / "cut.pth"
  cut.write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match=r"truncated .*offset \d+") as e: torch_load(cut)
  assert str(cut) in str(e.value)
  junk = tmp_path / "junk.pth"
  junk.write_bytes(b"this is not a checkpoint at all")
  with pytest.raises(CheckpointError, match="not a zip checkpoint") as e: torch_load(junk)
  assert str(junk) in str(e.value)
  short_pickle = _with_pickle(tmp_path, pickle.dumps({"a": 1}, protocol=2)[:-5])
  with pytest.raises(CheckpointError, match=r"data\.pkl: corrupt pickle at offset \d+") as e: torch_load(short_pickle)
  assert "evil2.pth" in str(e.value)
  legacy = tmp_path / "legacy.pt"
  buf = io.BytesIO()
  torch.save({"w": torch.ones(1)}, buf, _use_new_zipfile_serialization=False)
  legacy.write_bytes(buf.getvalue())
  with pytest.raises(CheckpointError, match="legacy"): torch_load(legacy)
  with pytest.raises(CheckpointError, match="cannot read checkpoint"): torch_load(tmp_path / "missing.pth")

# ** malformed archives and pickles that escaped as foreign exceptions or loaded (issue 24) **

class _StorageRef:
  def __init__(self, numel: int): self.numel = numel

class _TensorRef:
  """Pickles as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""
  def __init__(self, numel: int, offset: object, size: object, stride: object):
    self.args = (_StorageRef(numel), offset, size, stride, False, __import__("collections").OrderedDict())
  def __reduce__(self): return (torch._utils._rebuild_tensor_v2, self.args)

class _Pickler(pickle.Pickler):
  def persistent_id(self, obj):
    return ("storage", torch.FloatStorage, "0", "cpu", obj.numel) if isinstance(obj, _StorageRef) else None

def _tensor_pickle(numel: int, offset: object, size: object, stride: object) -> bytes:
  buf = io.BytesIO()
  _Pickler(buf, protocol=2).dump({"w": _TensorRef(numel, offset, size, stride)})
  return buf.getvalue()

def _nested(depth: int) -> list:
  out: list = []
  for _ in range(depth): out = [out]
  return out

@pytest.mark.parametrize("payload,match", [
  (_tensor_pickle(2, 0, (-1, 2), (2, 1)), r"size of a tensor: the shape \(-1, 2\) has a negative dimension"),
  (_tensor_pickle(2, 0, (2**62, 2**62), (0, 0)), "overflows int64"),
  (_tensor_pickle(2, -1, (1,), (1,)), "storage offset must be an integer >= 0"),
  (_tensor_pickle(2, 0, (2,), (-1,)), "stride"),
  (_tensor_pickle(2, 0, ("2",), (1,)), "size must be a tuple of integers"),
  (_tensor_pickle(-5, 0, (1,), (1,)), "unknown persistent id"),
  (b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"x.", "corrupt pickle at offset 2"),  # BINBYTES8 of 2**62 bytes
  (b"\x80\x02]r" + struct.pack("<I", 2**31 - 1) + b".", "memo index 2147483647 at offset 3 is out of range"),
  (pickle.dumps({"w": _nested(150)}, protocol=2), "deeper than 100 levels"),
  (b"\x80\x02L" + b"9" * 5000 + b"L\n.", "corrupt pickle at offset 2"),  # more digits than int() converts
])
def test_malformed_pickles_raise_checkpoint_error(tmp_path: Path, payload: bytes, match: str):
  with pytest.raises(CheckpointError, match=match) as e: torch_load(_with_pickle(tmp_path, payload))
  assert "evil2.pth" in str(e.value)

def _patched(tmp_path: Path, edit) -> Path:
  path = Path(_save(tmp_path, {"w": torch.ones(2)}))
  data = bytearray(path.read_bytes())
  edit(data)
  path.write_bytes(bytes(data))
  return path

def _central_entry(data: bytearray, suffix: bytes) -> int:
  """The offset of the central directory entry whose name ends with `suffix`."""
  at = 0
  while (at := data.find(b"PK\x01\x02", at + 1)) >= 0:
    name_len = struct.unpack("<H", data[at + 28:at + 30])[0]
    if data[at + 46:at + 46 + name_len].endswith(suffix): return at
  raise AssertionError(suffix)

def test_malformed_archives_raise_checkpoint_error(tmp_path: Path):
  # an unknown compression method (zipfile raises NotImplementedError when reading the member)
  def method_99(data: bytearray) -> None: data[_central_entry(data, b"data.pkl") + 10] = 99
  with pytest.raises(CheckpointError, match="data.pkl. .local header at offset 0. uses compression method 99"):
    torch_load(_patched(tmp_path, method_99))
  # a storage's central entry pointing at another member's local header
  def moved(data: bytearray) -> None:
    entry = _central_entry(data, b"data/0")
    data[entry + 42:entry + 46] = struct.pack("<I", 0)
  with pytest.raises(CheckpointError, match="local header of .ckpt.data.0. at offset 0 names another member"):
    torch_load(_patched(tmp_path, moved))
  # a member declaring a huge size (OverflowError / MemoryError before)
  def huge(data: bytearray) -> None:
    entry = _central_entry(data, b"data.pkl")
    data[entry + 24:entry + 28] = struct.pack("<I", 2**32 - 2)
  with pytest.raises(CheckpointError, match="declares 4294967294 bytes"): torch_load(_patched(tmp_path, huge))
  # torch.save's zip64 record placing itself on disk 1, and an end record counting one entry too many
  def two_disks(data: bytearray) -> None:
    record = data.rfind(b"PK\x06\x06")
    data[record + 16:record + 20] = struct.pack("<I", 1)
  with pytest.raises(CheckpointError, match="zip64 record at offset .* disagrees"):
    torch_load(_patched(tmp_path, two_disks))
  def one_more(data: bytearray) -> None:
    end = data.rfind(b"PK\x05\x06")
    data[end + 10:end + 12] = struct.pack("<H", struct.unpack("<H", data[end + 10:end + 12])[0] + 1)
  with pytest.raises(CheckpointError, match="end record at offset"): torch_load(_patched(tmp_path, one_more))
  # a member name given twice
  dup = tmp_path / "dup.pth"
  src = zipfile.ZipFile(_save(tmp_path, {"w": torch.ones(2)}))
  with pytest.warns(UserWarning), zipfile.ZipFile(dup, "w") as dst:
    for info in src.infolist(): dst.writestr(info.filename, src.read(info.filename))
    dst.writestr(src.infolist()[-1].filename, b"again")
  with pytest.raises(CheckpointError, match="more than once"): torch_load(dup)
