"""Data sets: an IDX reader, the Fashion-MNIST loader (Debian package `dataset-fashion-mnist`), a synthetic
classification set for fast tests, and a batching iterator that yields Tensors.

Arrays stay in numpy until a batch is cut, so shuffling and batching cost no kernels.

>>> x, y = synthetic_classification(64, features=8, classes=3)
>>> xb, yb = next(iter(batches(x, y, batch_size=16)))
>>> xb.shape, yb.shape
((16, 8), (16,))
"""
from __future__ import annotations
import gzip
import hashlib
import os
import shutil
import subprocess
from typing import Any, Iterator
import numpy as np
from ember.dtype import dtypes
from ember.errors import EmberError, ShapeError
from ember import Tensor

class DatasetError(EmberError, FileNotFoundError):
  """A data set is not installed, or a data file is truncated, corrupt or not what it claims to be."""

# ** IDX **

_IDX_DTYPES: dict[int, np.dtype[Any]] = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
                                         0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
  """Decode IDX bytes: magic (0, 0, dtype code, ndim), ndim big-endian uint32 dims, then the big-endian elements."""
  if len(data) < 4: raise DatasetError(f"{name}: {len(data)} bytes is too short for an IDX header (offset 0)")
  if data[0] != 0 or data[1] != 0:
    raise DatasetError(f"{name}: bad IDX magic {data[:4].hex()} at offset 0 (must start with 0000)")
  code, ndim = data[2], data[3]
  if code not in _IDX_DTYPES: raise DatasetError(f"{name}: unknown IDX element type 0x{code:02x} at offset 2")
  header = 4 + 4 * ndim
  if len(data) < header:
    raise DatasetError(f"{name}: truncated IDX header: {ndim} dims need {header} bytes, the file has {len(data)}")
  shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
  dt = _IDX_DTYPES[code]
  need = header + int(np.prod(shape, dtype=np.int64)) * dt.itemsize
  if len(data) != need:
    raise DatasetError(f"{name}: IDX shape {shape} of {dt.name} needs {need} bytes, the file has {len(data)} "
                       f"({'truncated' if len(data) < need else 'trailing data'} at offset {min(len(data), need)})")
  return np.frombuffer(data, dtype=dt, offset=header).reshape(shape).astype(dt.newbyteorder("="))

def read_idx(path: str) -> np.ndarray:
  """Read an IDX file, gzip-compressed (`.gz`, detected by its magic bytes) or not."""
  try:
    with open(path, "rb") as f: raw = f.read()
  except OSError as e: raise DatasetError(f"cannot read IDX file {path!r}: {e.strerror}") from e
  if raw[:2] == b"\x1f\x8b":
    try: raw = gzip.decompress(raw)
    except (OSError, EOFError) as e: raise DatasetError(f"{path}: corrupt gzip stream: {e}") from e
  return parse_idx(raw, path)

# ** Fashion-MNIST **

FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {"train-images": "train-images-idx3-ubyte.gz", "train-labels": "train-labels-idx1-ubyte.gz",
                       "t10k-images": "t10k-images-idx3-ubyte.gz", "t10k-labels": "t10k-labels-idx1-ubyte.gz"}
# sha256 of the decompressed files (first 16 hex digits), as published for the data set
FASHION_MNIST_SHA256 = {"train-images": "c59f468a2f672dc8", "train-labels": "bad3541b69d91243",
                        "t10k-images": "5b4141f0afbad91e", "t10k-labels": "0402a96d92fd2663"}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot")

def find_fashion_mnist() -> str:
  """The folder holding the four Fashion-MNIST IDX files: the package's usual place, else where `dpkg -L` lists them."""
  if all(os.path.exists(os.path.join(FASHION_MNIST_DIR, f)) for f in FASHION_MNIST_FILES.values()):
    return FASHION_MNIST_DIR
  if shutil.which("dpkg") is not None:
    dpkg = subprocess.run(["dpkg", "-L", FASHION_MNIST_PACKAGE], capture_output=True, text=True, check=False)
    listing = dpkg.stdout.splitlines()
    found = {os.path.basename(p): os.path.dirname(p) for p in listing if p.endswith("-ubyte.gz")}
    if all(f in found for f in FASHION_MNIST_FILES.values()): return found[FASHION_MNIST_FILES["train-images"]]
  raise DatasetError(f"Fashion-MNIST is not installed: the Debian package {FASHION_MNIST_PACKAGE!r} provides it; "
                     f"install it with `apt-get update && apt-get install -y {FASHION_MNIST_PACKAGE}`, "
                     "or pass the folder of the four *-ubyte.gz files as path=")

def fashion_mnist(path: str | None = None,
                  verify: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Train images (60000, 28, 28) uint8, train labels (60000,) uint8, test images (10000, 28, 28), test labels (10000,).

  With `verify` each decompressed file's sha256 is checked against the published digest.
  """
  folder = path if path is not None else find_fashion_mnist()
  arrays = {}
  for key, fname in FASHION_MNIST_FILES.items():
    fpath = os.path.join(folder, fname)
    try:
      with open(fpath, "rb") as f: raw = gzip.decompress(f.read())
    except OSError as e: raise DatasetError(f"cannot read Fashion-MNIST file {fpath!r}: {e}") from e
    if verify and (digest := hashlib.sha256(raw).hexdigest())[:16] != FASHION_MNIST_SHA256[key]:
      raise DatasetError(f"{fpath}: sha256 {digest[:16]}... does not match the published "
                         f"{FASHION_MNIST_SHA256[key]}...; "
                         f"the file is corrupt: reinstall with `apt-get install --reinstall {FASHION_MNIST_PACKAGE}`")
    arrays[key] = parse_idx(raw, fpath)
  return arrays["train-images"], arrays["train-labels"], arrays["t10k-images"], arrays["t10k-labels"]

# ** synthetic data and batching **

def synthetic_classification(n: int, features: int = 16, classes: int = 4, seed: int = 0,
                             spread: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
  """`n` float32 points in `classes` Gaussian blobs (centres drawn from N(0, 1), std `spread`), and int32 labels."""
  rng = np.random.default_rng(seed)
  centres = rng.standard_normal((classes, features)).astype(np.float32)
  labels = rng.integers(0, classes, size=n).astype(np.int32)
  points = centres[labels] + spread * rng.standard_normal((n, features)).astype(np.float32)
  return points.astype(np.float32), labels

def batches(x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = False, seed: int = 0,
            drop_last: bool = False, device: str | None = None) -> Iterator[tuple[Tensor, Tensor]]:
  """(inputs, labels) Tensor batches over the first dim; labels become int32. `shuffle` permutes with `seed`."""
  if len(x) != len(y): raise ShapeError(f"batches: {len(x)} inputs but {len(y)} labels")
  order = np.random.default_rng(seed).permutation(len(x)) if shuffle else np.arange(len(x))
  stop = len(x) - len(x) % batch_size if drop_last else len(x)
  for start in range(0, stop, batch_size):
    idx = order[start:start + batch_size]
    labels = Tensor(y[idx].astype(np.int32), device=device, dtype=dtypes.int32)
    yield Tensor(np.ascontiguousarray(x[idx]), device=device), labels

__all__ = ["DatasetError", "parse_idx", "read_idx", "fashion_mnist", "find_fashion_mnist", "synthetic_classification",
           "batches", "FASHION_MNIST_CLASSES", "FASHION_MNIST_PACKAGE"]
