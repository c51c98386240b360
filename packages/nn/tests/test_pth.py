"""PyTorch zip checkpoints: files torch.save writes here, read without torch and without executing their pickle; a
malicious pickle must raise before running; corrupt and truncated files raise errors naming the file and offset."""
from __future__ import annotations
import io
import os
import pickle
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
