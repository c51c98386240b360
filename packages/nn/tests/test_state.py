"""State dicts and safetensors: keys, strict loading with clear errors, and files checked against the reference
`safetensors` package (which reads and writes torch tensors, so bf16 and fp8 are covered)."""
from __future__ import annotations
import json
import struct
from pathlib import Path
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.nn import BatchNorm2d, Conv2d, Linear, Sequential
from ember.nn.state import (SafetensorsError, StateDictError, get_parameters, get_state_dict, load_state_dict,
                            safe_load, safe_load_metadata, safe_save)

class Net:
  def __init__(self):
    self.conv = Conv2d(1, 2, 3)
    self.bn = BatchNorm2d(2)
    self.head = [Linear(8, 3), Linear(3, 3)]
    self.alias = self.head[0]  # the same tensors under a second path: listed by get_state_dict, once by get_parameters

def test_state_dict_keys_and_parameters():
  net = Net()
  sd = get_state_dict(net)
  expected = {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
              "bn.num_batches_tracked", "head.0.weight", "head.0.bias", "head.1.weight", "head.1.bias", "alias.weight",
              "alias.bias"}
  assert set(sd) == expected
  params = get_parameters(net)
  assert len(params) == len(expected) - 2 and len({id(p) for p in params}) == len(params)

def test_load_state_dict_round_trip():
  a, b = Net(), Net()
  load_state_dict(b, get_state_dict(a))
  for k, v in get_state_dict(a).items():
    np.testing.assert_array_equal(get_state_dict(b)[k].numpy(), v.numpy(), err_msg=k)
  assert all(t.uop.is_realized for t in get_state_dict(b).values())

def test_load_state_dict_reports_every_problem():
  model = Sequential(Linear(4, 3), Linear(3, 2))
  sd = {"0.weight": Tensor.zeros(3, 5), "0.bias": Tensor.zeros(3), "1.weight": Tensor.zeros(2, 3, dtype=dtypes.float16),
        "extra": Tensor.zeros(1)}
  with pytest.raises(StateDictError) as e: load_state_dict(model, sd)
  msg = str(e.value)
  assert "missing keys: 1.bias" in msg and "unexpected keys: extra" in msg
  assert "0.weight: shape (3, 5) in the state dict, (3, 4) in the model" in msg
  assert "1.weight: dtype" in msg and "cast=True" in msg and "strict=False" in msg
  # non-strict loads what both have; cast=True converts the half tensor
  sd = {"1.weight": Tensor(np.arange(6, dtype=np.float16).reshape(2, 3)), "extra": Tensor.zeros(1)}
  load_state_dict(model, sd, strict=False, cast=True)
  np.testing.assert_array_equal(model[1].weight.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
  assert model[1].weight.dtype is dtypes.float32

ROUND_TRIP = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.bool_]

def test_safetensors_written_by_us_read_by_reference(tmp_path: Path):
  st = pytest.importorskip("safetensors.numpy")
  rng = np.random.default_rng(0)
  arrays = {f"t{i}.{np.dtype(dt).name}": (rng.standard_normal((3, 4)) * 50).astype(dt)
            for i, dt in enumerate(ROUND_TRIP)}
  arrays["scalar"] = np.array(2.5, dtype=np.float32)
  arrays["empty"] = np.zeros((0, 3), dtype=np.float32)
  path = str(tmp_path / "ours.safetensors")
  ours = {k: Tensor(v) if v.shape != () else Tensor(v.reshape(1)).reshape(()) for k, v in arrays.items()}
  safe_save(ours, path, {"format": "np"})
  back = st.load_file(path)
  assert set(back) == set(arrays)
  for k, v in arrays.items():
    assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
    np.testing.assert_array_equal(back[k], v, err_msg=k)
  assert safe_load_metadata(path)[2] == {"format": "np"}

def test_safetensors_written_by_reference_read_lazily(tmp_path: Path):
  torch = pytest.importorskip("torch")
  st = pytest.importorskip("safetensors.torch")
  g = torch.Generator().manual_seed(0)
  tensors = {"w.f32": torch.randn(4, 5, generator=g), "w.bf16": torch.randn(3, 7, generator=g).bfloat16(),
             "w.f16": torch.randn(6, generator=g).half(),
             "w.e4m3": (torch.randn(2, 8, generator=g) * 10).to(torch.float8_e4m3fn),
             "w.e5m2": (torch.randn(5, generator=g) * 100).to(torch.float8_e5m2),
             "ids": torch.arange(-5, 5, dtype=torch.int64)}
  path = str(tmp_path / "ref.safetensors")
  st.save_file(tensors, path)
  loaded = safe_load(path)
  # lazy: nothing has been read; each tensor is a copy of its own byte range of the mapped file
  assert not any(t.uop.is_realized for t in loaded.values())
  expected_dtypes = {"w.f32": dtypes.float32, "w.bf16": dtypes.bfloat16, "w.f16": dtypes.float16,
                     "w.e4m3": dtypes.fp8e4m3, "w.e5m2": dtypes.fp8e5m2, "ids": dtypes.int64}
  for k, ref in tensors.items():
    assert loaded[k].dtype is expected_dtypes[k] and loaded[k].shape == tuple(ref.shape), k
    np.testing.assert_array_equal(loaded[k].float().numpy() if ref.is_floating_point() else loaded[k].numpy(),
                                  ref.float().numpy() if ref.is_floating_point() else ref.numpy(), err_msg=k)
  # and back out: our file holds the same raw bits (bf16/fp8 included)
  out = str(tmp_path / "again.safetensors")
  safe_save(loaded, out)
  again = st.load_file(out)
  for k, ref in tensors.items(): assert torch.equal(again[k].view(torch.uint8), ref.view(torch.uint8)), k

def test_safe_load_on_disk_keeps_every_tensor_on_one_mapping(tmp_path: Path):
  arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(-2, 3, dtype=np.int16),
            "empty": np.zeros((0, 4), np.float32)}
  path = str(tmp_path / "w.safetensors")
  safe_save({k: Tensor(v) for k, v in arrays.items()}, path)
  loaded = safe_load(path, device="disk")
  assert {t.device for t in loaded.values()} == {f"DISK:{path}"}
  assert len({id(t.buffer().base) for t in loaded.values()}) == 1  # views of one mapping of the file, none copied
  for k, v in arrays.items(): np.testing.assert_array_equal(loaded[k].numpy(), v, err_msg=k)

def test_model_checkpoint_through_safetensors(tmp_path: Path):
  a, b = Net(), Net()
  path = str(tmp_path / "net.safetensors")
  safe_save(get_state_dict(a), path)
  load_state_dict(b, safe_load(path))
  x = Tensor(np.random.default_rng(1).standard_normal((2, 1, 6, 6)).astype(np.float32))
  def forward(n: Net) -> np.ndarray: return n.head[1](n.head[0](n.bn(n.conv(x)).reshape(2, -1)[:, :8])).numpy()
  np.testing.assert_allclose(forward(b), forward(a), atol=1e-6)

def _write(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> str:
  path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
  return str(path)

def _header(**entries: object) -> bytes: return json.dumps(entries).encode()

@pytest.mark.parametrize("make,match", [
  (lambda p: (p.write_bytes(b"\x01\x02"), str(p))[1], "too short"),
  (lambda p: _write(p, b"{}", length=1000), "header length 1000 at offset 0 runs past the end"),
  (lambda p: _write(p, b"{not json"), "JSON header at offset 8"),
  (lambda p: _write(p, _header(x={"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}), b"\0"), "dtype 'Q9'"),
  (lambda p: _write(p, _header(x={"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}), b"\0" * 4), "needs 8 bytes"),
  (lambda p: _write(p, _header(x={"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}), b"\0" * 8), "past the end"),
  (lambda p: _write(p, _header(x={"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}), b"\0" * 4),
   "field shape: the shape \\(-1,\\) has a negative dimension"),
  (lambda p: _write(p, _header(x={"shape": [1]})), "needs dtype, shape and data_offsets"),
  # malformed files that escaped as foreign exceptions or loaded (issue 24)
  (lambda p: _write(p, b"[" * 100_000 + b"]" * 100_000), "nests too deeply"),
  (lambda p: _write(p, b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'),
   "does not parse"),
  (lambda p: _write(p, _header(x={"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]})), "overflows int64"),
  (lambda p: _write(p, _header(x={"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}), b"\0" * 4), "dtype"),
  (lambda p: _write(p, b'{"x": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', b"\0" * 4),
   "list of integers"),
  (lambda p: _write(p, _header(__metadata__=[1], x={"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}), b"\0"),
   "__metadata__ at offset 9 must map strings"),
  (lambda p: _write(p, b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                       b'"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"), "names 'x' twice"),
  (lambda p: _write(p, _header(x={"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                               y={"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}), b"\0" * 3), "overlaps"),
  (lambda p: _write(p, _header(x={"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}), b"\0" * 3), "no gap"),
  (lambda p: _write(p, _header(x={"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}), b"\0" * 3),
   "trailing data"),
])
def test_corrupt_safetensors_raise_clear_errors(tmp_path: Path, make, match):
  path = make(tmp_path / "bad.safetensors")
  with pytest.raises(SafetensorsError, match=match) as e: safe_load(path)
  assert str(path) in str(e.value)

def test_safetensors_truncated_reference_file(tmp_path: Path):
  st = pytest.importorskip("safetensors.numpy")
  path = tmp_path / "cut.safetensors"
  st.save_file({"a": np.ones((16, 16), np.float32)}, str(path))
  path.write_bytes(path.read_bytes()[:-10])
  with pytest.raises(SafetensorsError, match="truncated"): safe_load(str(path))

def test_unreadable_paths_raise_safetensors_error(tmp_path: Path):
  with pytest.raises(SafetensorsError, match="cannot read safetensors file .*Is a directory"): safe_load(str(tmp_path))
  with pytest.raises(SafetensorsError, match="cannot open safetensors file"): safe_load(str(tmp_path / "missing"))

def test_a_models_own_function_adds_nothing_to_its_state_dict():
  # a per-instance ember.function keeps its traces, and the state they update (the RNG state a dropout advances),
  # out of the tensors get_state_dict and get_parameters find
  import ember
  from ember import Context
  class Block:
    def __init__(self) -> None:
      self.l = Linear(4, 4)
      self.run = ember.function(lambda x: self.l(x).dropout(0.5), precompile=True)
  block = Block()
  with Context(TRAINING=1):
    for _ in range(3): block.run(Tensor.ones(2, 4)).realize()
  assert sorted(get_state_dict(block)) == ["l.bias", "l.weight"]
  assert len(get_parameters(block)) == 2
