"""The public API third parties and ember.nn build on (docs/public-api.md): tensors over existing Buffers and file byte
ranges, the backing buffer of a tensor, `is_realized`, `pending_readers`, the training flag, and the declared public
names. numpy is the oracle for every value."""
from __future__ import annotations
import inspect
from pathlib import Path
import numpy as np
import pytest
import ember
import ember.dtype
import ember.errors
from ember import Buffer, Context, Tensor, dtypes
from ember.errors import DeviceError, DTypeError, EmberError, ShapeError

# core's own devices: tests-core runs without the CPU backend
def host_buffer(arr: np.ndarray, device: str = "PYTHON") -> Buffer:
  dt = dtypes.from_np(arr.dtype)
  return Buffer(device, arr.size, dt).copyin(memoryview(np.ascontiguousarray(arr)).cast("B"))

# ** from_buffer **

@pytest.mark.parametrize("device", ["PYTHON", "PYTHON:1"])
def test_from_buffer_is_the_buffer_without_a_copy(device: str) -> None:
  data = np.arange(12, dtype=np.float32)
  buf = host_buffer(data, device)
  t = Tensor.from_buffer(buf, (3, 4))
  assert (t.shape, t.dtype, t.device) == ((3, 4), dtypes.float32, device)
  np.testing.assert_array_equal(t.numpy(), data.reshape(3, 4))
  assert t.is_realized and t.buffer() is buf
  buf.copyin(memoryview(-data).cast("B"))  # a write to the buffer shows in the tensor
  np.testing.assert_array_equal((t + 1).numpy(), -data.reshape(3, 4) + 1)

@pytest.mark.parametrize("np_dtype, as_dtype", [(np.uint8, dtypes.uint16), (np.float32, dtypes.int32),
                                                (np.int64, dtypes.uint8)])
def test_from_buffer_reads_the_bytes_as_another_dtype(np_dtype: type, as_dtype: ember.DType) -> None:
  data = np.arange(16, dtype=np_dtype) * 3
  t = Tensor.from_buffer(host_buffer(data), dtype=as_dtype)
  np.testing.assert_array_equal(t.numpy(), data.view(as_dtype.fmt))

def test_from_buffer_refuses_what_does_not_fit() -> None:
  buf = host_buffer(np.arange(6, dtype=np.uint8))
  with pytest.raises(ShapeError, match=r"shape \(4,\) does not fit a buffer of 6") as e: Tensor.from_buffer(buf, (4,))
  assert isinstance(e.value, ValueError)
  with pytest.raises(ShapeError, match="not a whole number of dtypes.float32"): Tensor.from_buffer(buf, dtype="float32")
  with pytest.raises(DTypeError, match="takes an ember Buffer, got ndarray") as t:
    Tensor.from_buffer(np.zeros(3))  # type: ignore[arg-type]
  assert isinstance(t.value, TypeError)
  with pytest.raises(DTypeError, match="weak"): Tensor.from_buffer(buf, dtype=dtypes.weakint)

# ** from_file **

@pytest.fixture
def weights(tmp_path: Path) -> tuple[str, np.ndarray]:
  data = np.random.default_rng(0).normal(size=40).astype(np.float32)
  path = tmp_path / "w.bin"
  data.tofile(path)
  return str(path), data

@pytest.mark.parametrize("offset, shape, np_dtype", [(0, (40,), np.float32), (8, (3, 4), np.float32), (12, 7, np.int32),
                                                     (3, (7,), np.uint8), (2, (5, 3), np.float16)])
def test_from_file_reads_the_byte_range(weights: tuple[str, np.ndarray], offset: int, shape: tuple[int, ...],
                                        np_dtype: type) -> None:
  path, _ = weights
  want = np.fromfile(path, dtype=np_dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
  t = Tensor.from_file(path, offset, shape, dtypes.from_np(np.dtype(np_dtype)))
  assert t.device == ember.Device.DEFAULT and t.shape == want.shape
  np.testing.assert_array_equal(t.numpy(), want)

def test_from_file_bfloat16_is_the_raw_bits(weights: tuple[str, np.ndarray]) -> None:
  path, _ = weights
  bits = np.fromfile(path, dtype=np.uint16, count=6, offset=4)
  want = (bits.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is the top half of a float32
  np.testing.assert_array_equal(Tensor.from_file(path, 4, (6,), dtypes.bfloat16).numpy(), want)

def test_from_file_default_shape_is_the_rest_of_the_file(weights: tuple[str, np.ndarray]) -> None:
  path, data = weights
  np.testing.assert_array_equal(Tensor.from_file(path).numpy(), data.view(np.uint8))
  np.testing.assert_array_equal(Tensor.from_file(path, 6, dtype=dtypes.float32).numpy(),
                                np.fromfile(path, dtype=np.float32, offset=6))  # 38 whole floats after byte 6
  assert Tensor.from_file(path, data.nbytes).shape == (0,)

def test_from_file_on_disk_stays_on_the_file_and_shares_one_mapping(weights: tuple[str, np.ndarray]) -> None:
  path, data = weights
  a = Tensor.from_file(path, 0, (10,), dtypes.float32, device="DISK")
  b = Tensor.from_file(path, 40, (2, 5), dtypes.float32, device="disk")
  assert a.device == b.device == f"DISK:{path}"
  np.testing.assert_array_equal(b.to("PYTHON").numpy(), data[10:20].reshape(2, 5))
  assert a.buffer().base is b.buffer().base  # views of one whole-file buffer, not a mapping per tensor
  np.testing.assert_array_equal((a.to(None) * 2).numpy(), data[:10] * 2)

def test_from_file_is_read_when_realized(weights: tuple[str, np.ndarray]) -> None:
  path, data = weights
  t = Tensor.from_file(path, 16, (4,), dtypes.float32)
  with open(path, "r+b") as f:  # the bytes change after the tensor is made, before it is realized
    f.seek(16)
    f.write(np.arange(4, dtype=np.float32).tobytes())
  np.testing.assert_array_equal(t.numpy(), np.arange(4, dtype=np.float32))

def test_from_file_sees_a_file_rewritten_with_another_size(weights: tuple[str, np.ndarray]) -> None:
  path, data = weights
  first = Tensor.from_file(path, 0, (40,), dtypes.float32, device="DISK")
  longer = np.concatenate([data, data * 10])
  longer.tofile(path)
  np.testing.assert_array_equal(Tensor.from_file(path, 160, (40,), dtypes.float32).numpy(), data * 10)
  assert first.shape == (40,)

def test_from_file_errors_name_the_range_and_the_file(weights: tuple[str, np.ndarray], tmp_path: Path) -> None:
  path, data = weights
  with pytest.raises(ShapeError, match=rf"bytes 152\.\.168, but '{path}' has 160") as e:
    Tensor.from_file(path, 152, (4,), dtypes.float32)
  assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
  with pytest.raises(ShapeError, match="offset must be an int >= 0, got -4"): Tensor.from_file(path, -4)
  with pytest.raises(ShapeError, match="offset 161 is past the end .* 160 bytes"): Tensor.from_file(path, 161)
  with pytest.raises(ShapeError, match="must be ints"): Tensor.from_file(path, 0, (ember.Variable("n", 1, 4),))
  with pytest.raises(DeviceError, match="No such file") as d: Tensor.from_file(tmp_path / "missing.bin")
  assert isinstance(d.value, RuntimeError)  # as torch.from_file
  with pytest.raises(DeviceError, match="not one"): Tensor.from_file(tmp_path)
  with pytest.raises(DTypeError, match="weak"): Tensor.from_file(path, dtype=dtypes.weakfloat)

# ** data out, realization, readers **

def test_buffer_is_the_backing_buffer_of_a_whole_buffer_tensor() -> None:
  t = (Tensor(np.arange(6, dtype=np.int32)) * 2).contiguous().realize()
  buf = t.buffer()
  assert buf is t.buffer() and buf.size == 6 and buf.dtype == dtypes.int32
  buf.copyin(memoryview(np.full(6, 7, np.int32)).cast("B"))
  np.testing.assert_array_equal(t.numpy(), np.full(6, 7))
  view = t[2:5]  # not a whole buffer: copied, and the copy holds the view's elements
  np.testing.assert_array_equal(view.buffer().numpy(), np.full(3, 7))
  assert Tensor(2.5).buffer().numpy().tolist() == [2.5]  # a weak scalar commits to the default float

def test_is_realized() -> None:
  t = Tensor(np.arange(4, dtype=np.float32))
  assert t.is_realized and t.reshape(2, 2).is_realized
  lazy = t + 1
  assert not lazy.is_realized and lazy.realize().is_realized
  assert not t[1:].is_realized and not t.flip(0).is_realized  # views still to be copied
  assert not Tensor.zeros(3).realize().is_realized and Tensor.zeros(3).contiguous().realize().is_realized
  t.assign(t * 2)
  assert not t.is_realized and t.realize().is_realized

def test_pending_readers_are_the_lazy_tensors_reading_the_buffers() -> None:
  w = Tensor(np.arange(3, dtype=np.float32))
  other = Tensor(np.ones(3, dtype=np.float32))
  reader, unrelated = (w * 2).sum(), other + 1
  done = (w + 1).realize()
  pending = Tensor.pending_readers(w)
  assert [id(t) for t in pending] == [id(reader)]
  assert {id(t) for t in Tensor.pending_readers(w, other)} == {id(reader), id(unrelated)}
  assert done.is_realized
  Tensor.realize(*pending)
  w.assign(Tensor.zeros(3)).realize()
  assert reader.item() == 6.0  # computed from w's value before the overwrite

def test_training_mode_is_the_flag_or_the_context() -> None:
  assert not Tensor.is_training()
  x = Tensor.ones(64)
  np.testing.assert_array_equal(x.dropout(0.5).numpy(), np.ones(64))
  with Context(TRAINING=1):
    assert Tensor.is_training()
    out = x.dropout(0.5).numpy()
  assert set(np.unique(out)) <= {0.0, 2.0} and 0 < (out == 0).sum() < 64  # dropped out, the rest scaled by 1/(1-p)
  saved, Tensor.training = Tensor.training, True
  try: assert Tensor.is_training()
  finally: Tensor.training = saved

# ** the declared public names **

@pytest.mark.parametrize("module", [ember, ember.errors, ember.dtype])
def test_public_names_exist(module: object) -> None:
  names = module.__all__  # type: ignore[attr-defined]
  assert len(names) == len(set(names)) and [n for n in names if not hasattr(module, n)] == []

def test_every_error_class_is_public() -> None:
  classes = {n for n, c in vars(ember.errors).items() if inspect.isclass(c) and issubclass(c, EmberError)}
  assert classes == set(ember.errors.__all__)
