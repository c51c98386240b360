"""The IDX reader on bytes encoded here, the Fashion-MNIST loader against the golden digests, and batching."""
from __future__ import annotations
import gzip
import hashlib
import json
import struct
from pathlib import Path
import numpy as np
import pytest
from ember.nn.datasets import (DatasetError, batches, fashion_mnist, find_fashion_mnist, parse_idx, read_idx,
                                synthetic_classification)

def _idx(arr: np.ndarray, code: int) -> bytes:
  header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
  return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()

@pytest.mark.parametrize("dtype,code", [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C),
                                        (np.float32, 0x0D), (np.float64, 0x0E)])
def test_parse_idx_every_type(dtype, code):
  arr = (np.random.default_rng(0).standard_normal((3, 4, 2)) * 100).astype(dtype)
  out = parse_idx(_idx(arr, code))
  assert out.dtype == np.dtype(dtype) and out.shape == arr.shape
  np.testing.assert_array_equal(out, arr)

def test_read_idx_gzip_and_errors(tmp_path: Path):
  arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  (tmp_path / "a.gz").write_bytes(gzip.compress(_idx(arr, 0x08)))
  np.testing.assert_array_equal(read_idx(str(tmp_path / "a.gz")), arr)
  with pytest.raises(DatasetError, match="truncated at offset 34"): parse_idx(_idx(arr, 0x08)[:-6], "cut")
  with pytest.raises(DatasetError, match="bad IDX magic"): parse_idx(b"\x01\x00\x08\x01\x00\x00\x00\x00")
  with pytest.raises(DatasetError, match="unknown IDX element type 0x07"):
    parse_idx(b"\x00\x00\x07\x01\x00\x00\x00\x00")
  (tmp_path / "bad.gz").write_bytes(gzip.compress(_idx(arr, 0x08))[:-8])
  with pytest.raises(DatasetError, match="corrupt gzip"): read_idx(str(tmp_path / "bad.gz"))

def _installed() -> bool:
  try: find_fashion_mnist()
  except DatasetError: return False
  return True

@pytest.mark.skipif(not _installed(), reason="Fashion-MNIST is absent (apt-get install -y dataset-fashion-mnist)")
def test_fashion_mnist_matches_golden(golden: Path):
  expected = json.loads((golden / "fashion-mnist.json").read_text())
  x_train, y_train, x_test, y_test = fashion_mnist(verify=False)
  arrays = {"train-images": x_train, "train-labels": y_train, "t10k-images": x_test, "t10k-labels": y_test}
  for key, arr in arrays.items():
    assert list(arr.shape) == expected["shapes"][key] and arr.dtype == np.uint8, key
    # the digest of the decompressed IDX file, rebuilt from the parsed array
    raw = _idx(arr, 0x08)
    assert hashlib.sha256(raw).hexdigest().startswith(expected["decompressed_sha256_prefix"][key]), key
  assert set(np.unique(y_train).tolist()) == set(range(10))

def test_fashion_mnist_missing_names_the_package(tmp_path: Path):
  with pytest.raises(DatasetError, match="cannot read Fashion-MNIST file"): fashion_mnist(str(tmp_path))

def test_fashion_mnist_checksum_mismatch(tmp_path: Path):
  files = {"train-images-idx3-ubyte.gz": np.zeros((2, 28, 28), np.uint8),
           "train-labels-idx1-ubyte.gz": np.zeros(2, np.uint8),
           "t10k-images-idx3-ubyte.gz": np.zeros((1, 28, 28), np.uint8),
           "t10k-labels-idx1-ubyte.gz": np.zeros(1, np.uint8)}
  for name, arr in files.items(): (tmp_path / name).write_bytes(gzip.compress(_idx(arr, 0x08)))
  with pytest.raises(DatasetError, match="does not match the published"): fashion_mnist(str(tmp_path))
  assert fashion_mnist(str(tmp_path), verify=False)[0].shape == (2, 28, 28)

def test_batches_cover_every_row_once():
  x, y = synthetic_classification(50, features=3, classes=2)
  seen = [(xb.numpy(), yb.numpy()) for xb, yb in batches(x, y, 16, shuffle=True, seed=1)]
  assert [len(b[1]) for b in seen] == [16, 16, 16, 2]
  xs = np.concatenate([b[0] for b in seen])
  order = np.lexsort(xs.T)
  np.testing.assert_array_equal(xs[order], x[np.lexsort(x.T)])
  assert len(list(batches(x, y, 16, drop_last=True))) == 3
