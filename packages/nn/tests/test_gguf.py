"""GGUF dequantisation on the device against the reference `gguf` package (on blocks built here with random bits and
finite float16 scales), GGUF files written by the reference writer, and truncated or corrupt files."""
from __future__ import annotations
import struct
from pathlib import Path
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.nn.gguf import BLOCK_LAYOUT, DEQUANTIZERS, GGMLType, GGUFError, dequantize, gguf_load

gguf = pytest.importorskip("gguf")

# byte offsets of each type's float16 scale fields: random bits there could be inf/nan, so they get finite values
SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
                 "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}

def _blocks(name: str, n_blocks: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  elems, nbytes = BLOCK_LAYOUT[GGMLType[name]]
  if name == "F32": return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
  if name == "F16": return rng.standard_normal(n_blocks).astype(np.float16).view(np.uint8)
  if name == "BF16": return (rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(
    np.uint16).view(np.uint8)
  raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
  for off in SCALE_OFFSETS[name]:
    raw[:, off:off + 2] = (rng.uniform(-2, 2, size=(n_blocks, 1)) * 2.0 ** -4).astype(np.float16).view(np.uint8)
  return raw.reshape(-1)

@pytest.mark.parametrize("name", [t.name for t in DEQUANTIZERS])
def test_dequantize_matches_reference(name: str):
  n_blocks = 3 if BLOCK_LAYOUT[GGMLType[name]][0] > 1 else 96
  raw = _blocks(name, n_blocks)
  qtype = gguf.GGMLQuantizationType[name]
  expected = gguf.quants.dequantize(raw, qtype).reshape(-1).astype(np.float32)
  shape = (len(expected) // 32, 32)
  got = dequantize(Tensor(raw), name, shape)
  assert got.dtype is dtypes.float32 and got.shape == shape
  np.testing.assert_array_equal(got.numpy().reshape(-1), expected)

def test_dequantize_errors():
  def raw(n: int) -> Tensor: return Tensor.zeros(n, dtype=dtypes.uint8)
  with pytest.raises(GGUFError, match="not a multiple of its block size 32"): dequantize(raw(18), "Q4_0", (31,))
  with pytest.raises(GGUFError, match="needs 36 bytes, got 18"): dequantize(raw(18), "Q4_0", (64,))
  with pytest.raises(GGUFError, match="unknown GGML tensor type 'Q9_9'"): dequantize(raw(4), "Q9_9", (1,))
  with pytest.raises(GGUFError, match="Q8_K is not supported"): dequantize(raw(4), "Q8_K", (256,))
  with pytest.raises(GGUFError, match="uint8"): dequantize(Tensor.zeros(1, dtype=dtypes.float32), "F32", (1,))

def _write_file(path: Path) -> dict[str, np.ndarray]:
  """A GGUF file from the reference writer: one float32, one float16 and three quantised tensors."""
  rng = np.random.default_rng(3)
  writer = gguf.GGUFWriter(str(path), "test")
  writer.add_uint32("test.answer", 42)
  writer.add_string("test.name", "tiny")
  expected = {}
  plain = {"f32": rng.standard_normal((4, 8)).astype(np.float32),
           "f16": rng.standard_normal((3, 32)).astype(np.float16)}
  for name, arr in plain.items():
    writer.add_tensor(name, arr)
    expected[name] = arr.astype(np.float32)
  for name, (qname, rows) in {"q8": ("Q8_0", 2), "q4k": ("Q4_K", 1), "q5_0": ("Q5_0", 2)}.items():
    elems, nbytes = BLOCK_LAYOUT[GGMLType[qname]]
    cols = 2 * elems
    raw = _blocks(qname, rows * 2, seed=len(name)).reshape(rows, 2 * nbytes)
    qtype = gguf.GGMLQuantizationType[qname]
    writer.add_tensor(name, raw, raw_dtype=qtype)  # the shape of a quantised tensor is given in bytes
    expected[name] = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return expected

def test_reference_file_loads_lazily(tmp_path: Path):
  path = tmp_path / "tiny.gguf"
  expected = _write_file(path)
  meta, tensors = gguf_load(path)
  assert meta["test.answer"] == 42 and meta["test.name"] == "tiny"
  assert set(tensors) == set(expected)
  assert not any(t.uop.is_realized for t in tensors.values())
  for name, arr in expected.items():
    assert tensors[name].shape == arr.shape, name
    np.testing.assert_array_equal(tensors[name].numpy(), arr, err_msg=name)

def test_corrupt_files_name_file_and_offset(tmp_path: Path):
  path = tmp_path / "tiny.gguf"
  _write_file(path)
  data = path.read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:-40])
  with pytest.raises(GGUFError, match=r"past the end of the file at offset \d+; the file is truncated") as e:
    gguf_load(cut)
  assert str(cut) in str(e.value)
  header_cut = tmp_path / "header.gguf"
  header_cut.write_bytes(data[:60])
  with pytest.raises(GGUFError, match=r"at offset \d+: .*truncated") as e: gguf_load(header_cut)
  assert str(header_cut) in str(e.value)
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGUX" + data[4:])
  with pytest.raises(GGUFError, match="not a GGUF file") as e: gguf_load(bad)
  assert str(bad) in str(e.value)

# ** malformed headers that escaped as foreign exceptions or loaded (issue 24), built field by field **

def _s(text: str) -> bytes: return struct.pack("<Q", len(text.encode())) + text.encode()

def _gguf(kvs: list[bytes], tensors: list[tuple[str, list[int], int, int]], data: bytes = b"\0" * 64) -> bytes:
  """A v3 file: raw key/value records, tensor infos (name, GGUF dims innermost first, ggml type, offset), data."""
  out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
  for name, dims, gtype, offset in tensors:
    out += _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    out += struct.pack("<IQ", gtype, offset)
  return out + b"\0" * (-len(out) % 32) + data

def _kv(key: str, vtype: int, payload: bytes) -> bytes: return _s(key) + struct.pack("<I", vtype) + payload

F32_W = [("w", [2], 0, 0)]

@pytest.mark.parametrize("data,match", [
  (_gguf([_kv("general.alignment", 8, _s("32"))], F32_W), r"\(value at offset 53\) must be a uint32 .*, got STR"),
  (_gguf([_kv("general.alignment", 6, struct.pack("<f", 32.0))], F32_W), "must be a uint32 power of two, got FLOAT32"),
  (_gguf([_kv("general.alignment", 4, struct.pack("<I", 0))], F32_W), "power of two, got UINT32 0"),
  (_gguf([_kv("deep", 9, struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0))], F32_W),
   r"'deep'.* at offset \d+: arrays nest deeper than 8 levels"),
  (_gguf([], [("w", [2**32, 2**32], 0, 0)]), "field dims: the shape .* overflows int64"),
  (_gguf([], [("w", [2], 0, 0), ("w", [2], 0, 32)]), r"tensor 'w' at offset \d+: the name appears twice"),
  (_gguf([_kv("k", 4, b"\1\0\0\0"), _kv("k", 4, b"\2\0\0\0")], F32_W), r"key 'k' at offset 41: the key appears"),
  (_gguf([], [("a", [8], 0, 0), ("b", [8], 0, 0)]), r"tensor 'b' at bytes \d+..\d+ overlaps tensor 'a'"),
  (_gguf([], [("w", [2], 99, 0)]), r"the type of tensor 'w' at offset \d+: unknown GGML type id 99"),
  (_gguf([], [("w", [2], 0, 4)]), "the offset of tensor 'w' at offset .*: 4 is not a multiple of the alignment 32"),
  (_gguf([], [("w", [2, 1, 1, 1, 1], 0, 0)]), "the rank of tensor 'w' at offset .*: 5 > 4 dimensions"),
  (_gguf([_kv("k", 8, struct.pack("<Q", 2) + b"\xff\xfe")], F32_W), "'k' at offset 37: the string is not UTF-8"),
  (_gguf([_kv("k", 9, struct.pack("<IQ", 8, 2**60))], F32_W), r"the length of 'k' at offset \d+: 1152921504606846976"),
  (b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0) + b"\0" * 16, "the tensor count at offset 8"),
])
def test_malformed_headers_raise_gguf_error(tmp_path: Path, data: bytes, match: str):
  path = tmp_path / "bad.gguf"
  path.write_bytes(data)
  with pytest.raises(GGUFError, match=match) as e: gguf_load(path)
  assert str(path) in str(e.value)

def test_nested_arrays_within_the_bound_load(tmp_path: Path):
  path = tmp_path / "ok.gguf"
  path.write_bytes(_gguf([_kv("nest", 9, struct.pack("<IQ", 9, 1) * 3 + struct.pack("<IQI", 4, 1, 7))], F32_W))
  meta, tensors = gguf_load(path)
  assert meta["nest"] == [[[[7]]]] and tensors["w"].numpy().tolist() == [0.0, 0.0]
