"""GGUF parsing of files written by the test writer, and dequantisation of hand-built blocks against scalar
implementations written from the format's definition."""
from __future__ import annotations
import struct
import numpy as np
import pytest
from ember import Tensor
from ember.nn.gguf import GGMLType, GGUFError, GGUFFile, dequantize as dequantize_tensor

def dequantize(raw: bytes, kind: GGMLType, shape: tuple[int, ...]) -> np.ndarray:
  """The reader's dequantisation (on the device) of raw bytes, read back."""
  return dequantize_tensor(Tensor(np.frombuffer(raw, np.uint8).copy()), kind, shape).numpy()

def test_header_metadata_all_types_and_tensors(tmp_path, gguf_writer):
  md = {"u8": ("u8", 200), "i8": ("i8", -100), "u16": ("u16", 60000), "i16": ("i16", -30000),
        "u32": ("u32", 4_000_000_000),
        "i32": ("i32", -2_000_000_000), "f32": ("f32", 1.5), "bool": ("bool", True), "str": ("str", "héllo ✓"),
        "u64": ("u64", 2**63 + 5), "i64": ("i64", -(2**62)), "f64": ("f64", 0.1), "arr_i32": ("arr", [1, -2, 3], "i32"),
        "arr_str": ("arr", ["a", "", "ünï"], "str"), "arr_f32": ("arr", [0.5, -2.0], "f32"),
        "arr_nested": ("arr", [[1, 2], [3]], "arr"), "general.alignment": ("u32", 64)}
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  b = np.linspace(-1, 1, 5).astype(np.float16)
  tensors = {"a": (0, a.shape, a.tobytes()), "b": (1, b.shape, b.tobytes())}
  path = gguf_writer(tmp_path / "t.gguf", md, tensors, alignment=64)
  f = GGUFFile(path)
  assert f.version == 3 and f.alignment == 64 and f.data_offset % 64 == 0
  expected = {k: v[1] for k, v in md.items()}
  expected["arr_nested"] = [[1, 2], [3]]
  for k, v in expected.items():
    if isinstance(v, float): assert f.metadata[k] == pytest.approx(v, rel=1e-6)
    elif k == "arr_f32": assert f.metadata[k] == pytest.approx(v)
    else: assert f.metadata[k] == v, k
  assert f.tensors["a"].shape == (3, 4) and f.tensors["a"].ggml_type is GGMLType.F32
  np.testing.assert_array_equal(f.tensor("a"), a)
  np.testing.assert_array_equal(f.tensor("b"), b.astype(np.float32))
  assert f.type_counts() == {"F32": 1, "F16": 1}

def test_version_2_reads(tmp_path, gguf_writer):
  a = np.ones((2, 2), np.float32)
  f = GGUFFile(gguf_writer(tmp_path / "v2.gguf", {"x": 1}, {"a": (0, (2, 2), a.tobytes())}, version=2))
  assert f.version == 2 and f.metadata["x"] == 1
  np.testing.assert_array_equal(f.tensor("a"), a)

def test_errors_are_typed(tmp_path, gguf_writer):
  with pytest.raises(GGUFError, match="version 1 is not supported"):
    GGUFFile(gguf_writer(tmp_path / "v1.gguf", {}, {}, version=1))
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGML" + b"\0" * 40)
  with pytest.raises(GGUFError, match="not a GGUF file"): GGUFFile(bad)
  path = gguf_writer(tmp_path / "trunc.gguf", {"k": "v"}, {"a": (0, (64,), np.zeros(64, np.float32).tobytes())})
  data = path.read_bytes()
  path.write_bytes(data[:len(data) - 100])
  with pytest.raises(GGUFError, match="truncated"): GGUFFile(path)
  q8_1 = gguf_writer(tmp_path / "q8_1.gguf", {}, {"w": (9, (32,), b"\0" * 36)})
  with pytest.raises(GGUFError, match="Q8_1 is not supported"): GGUFFile(q8_1).tensor("w")
  with pytest.raises(GGUFError, match="no tensor named"): GGUFFile(q8_1).tensor("nope")
  with pytest.raises(GGUFError, match="does not exist"): GGUFFile(tmp_path / "missing.gguf")

# ** dequantisation: blocks built with numpy, expected values from the block definitions, element by element **

def _f16_bytes(x: float) -> bytes: return np.float16(x).tobytes()
def _f16_val(x: float) -> float: return float(np.float16(x))

def test_dequant_q4_0():
  rng = np.random.default_rng(1)
  blocks, expected = [], []
  for _ in range(5):
    d, q = float(rng.uniform(-2, 2)), rng.integers(0, 16, 32)
    packed = bytes(int(q[j]) | (int(q[j + 16]) << 4) for j in range(16))  # element j low nibble, j+16 high nibble
    blocks.append(_f16_bytes(d) + packed)
    expected += [_f16_val(d) * (int(q[j]) - 8) for j in range(32)]
  out = dequantize(b"".join(blocks), GGMLType.Q4_0, (5, 32))
  np.testing.assert_allclose(out.reshape(-1), expected, rtol=1e-6)

def test_dequant_q4_1():
  rng = np.random.default_rng(2)
  blocks, expected = [], []
  for _ in range(4):
    d, m, q = float(rng.uniform(0, 1)), float(rng.uniform(-1, 1)), rng.integers(0, 16, 32)
    packed = bytes(int(q[j]) | (int(q[j + 16]) << 4) for j in range(16))
    blocks.append(_f16_bytes(d) + _f16_bytes(m) + packed)
    expected += [_f16_val(d) * int(q[j]) + _f16_val(m) for j in range(32)]
  out = dequantize(b"".join(blocks), GGMLType.Q4_1, (2, 64))
  np.testing.assert_allclose(out.reshape(-1), expected, rtol=1e-6, atol=1e-7)

def test_dequant_q8_0():
  rng = np.random.default_rng(3)
  d, q = 0.03125, rng.integers(-128, 128, 64)
  raw = b"".join(_f16_bytes(d) + q[i * 32:(i + 1) * 32].astype(np.int8).tobytes() for i in range(2))
  np.testing.assert_allclose(dequantize(raw, GGMLType.Q8_0, (64,)), q * d)

def test_dequant_float_types():
  x = np.random.default_rng(4).standard_normal(8).astype(np.float32)
  bf16_bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exactly representable bfloat16 values
  expected_bf16 = [struct.unpack("<f", struct.pack("<I", int(b) << 16))[0] for b in bf16_bits]
  np.testing.assert_array_equal(dequantize(bf16_bits.tobytes(), GGMLType.BF16, (8,)), expected_bf16)
  np.testing.assert_array_equal(dequantize(x.tobytes(), GGMLType.F32, (2, 4)), x.reshape(2, 4))

def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
  if j < 4: return q[j] & 63, q[j + 4] & 63
  return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)

def test_dequant_q4_k():
  rng = np.random.default_rng(5)
  d, dmin = 0.0123, 0.0456
  scales = bytes(rng.integers(0, 256, 12).tolist())
  qs = bytes(rng.integers(0, 256, 128).tolist())
  raw = _f16_bytes(d) + _f16_bytes(dmin) + scales + qs
  expected, qi = [], 0
  for j in range(0, 256, 64):  # the reference loop of the format: two sub-blocks of 32 per 32 bytes
    sc1, m1 = _scale_min_k4(j // 32, scales)
    sc2, m2 = _scale_min_k4(j // 32 + 1, scales)
    expected += [_f16_val(d) * sc1 * (qs[qi + l] & 0xF) - _f16_val(dmin) * m1 for l in range(32)]
    expected += [_f16_val(d) * sc2 * (qs[qi + l] >> 4) - _f16_val(dmin) * m2 for l in range(32)]
    qi += 32
  np.testing.assert_allclose(dequantize(raw, GGMLType.Q4_K, (256,)), expected, rtol=1e-5, atol=1e-6)

def test_dequant_q6_k():
  rng = np.random.default_rng(6)
  ql, qh = bytes(rng.integers(0, 256, 128).tolist()), bytes(rng.integers(0, 256, 64).tolist())
  sc = rng.integers(-128, 128, 16).astype(np.int8)
  d = 0.0071
  raw = ql + qh + sc.tobytes() + _f16_bytes(d)
  y = [0.0] * 256
  for half in range(2):
    L, H, S, Y = ql[64 * half:], qh[32 * half:], sc[8 * half:], 128 * half
    for l in range(32):
      is_ = l // 16
      q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32
      q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32
      q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
      q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
      dd = _f16_val(d)
      y[Y + l], y[Y + l + 32] = dd * int(S[is_]) * q1, dd * int(S[is_ + 2]) * q2
      y[Y + l + 64], y[Y + l + 96] = dd * int(S[is_ + 4]) * q3, dd * int(S[is_ + 6]) * q4
  np.testing.assert_allclose(dequantize(raw, GGMLType.Q6_K, (256,)), y, rtol=1e-5, atol=1e-7)

def test_quantized_tensor_in_file(tmp_path, gguf_writer):
  d, m = 0.5, -1.0
  q = np.arange(32) % 16
  block = _f16_bytes(d) + _f16_bytes(m) + bytes(int(q[j]) | (int(q[j + 16]) << 4) for j in range(16))
  f = GGUFFile(gguf_writer(tmp_path / "q.gguf", {}, {"w": (3, (2, 32), block * 2)}))
  np.testing.assert_allclose(f.tensor("w"), np.tile(q * d + m, (2, 1)))
  with pytest.raises(GGUFError, match="not a multiple of its block size"): dequantize(b"\0" * 20, GGMLType.Q4_1, (31,))
