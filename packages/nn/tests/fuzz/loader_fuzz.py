"""Seeded mutation fuzzing of the weight-file readers (safetensors, GGUF, PyTorch zip checkpoints).

Seed files are written here by the reference writers (`safetensors`, `gguf.GGUFWriter`, `torch.save`) and by a small
GGUF writer that records where each integer field sits. Each case is one mutated file: a truncation, byte flips,
a header field set to an awkward value (a count, a length, a shape, an offset, a type, a zip directory field, an
integer inside the pickle), or one of the targeted files that escaped before (issue 24).

A case passes when the reader either raises its typed error (a `WeightFormatError`, naming the file) or loads a
result the reference reader agrees with: `safetensors.numpy.load`, `gguf.GGUFReader` + `gguf.quants.dequantize`,
`torch.load(weights_only=True)` on the same bytes. A foreign exception, a crash of the worker process, a case running
past its time bound, a file the reference refuses but ember loads, or values that differ are failures.

Cases run in worker processes (`run_cases`), each under a SIGALRM time bound, on DEV=PYTHON (the bounds-checked
interpreter device: no compiler in the loop, and a read outside a buffer raises instead of crashing).
"""
from __future__ import annotations
import collections
import io
import json
import os
import pickle
import pickletools
import random
import signal
import struct
import tempfile
import traceback
import zipfile
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
import multiprocessing
from typing import Any, Callable
import numpy as np

CASE_SECONDS = 20  # a case running longer is a hang
AWKWARD_INTS = [0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
                2**63 - 1, 2**63, 2**64 - 1]

@dataclass(frozen=True)
class Case:
  fmt: str  # "safetensors" | "gguf" | "pth"
  label: str  # how the file was made, to reproduce a failure
  data: bytes

@dataclass
class Report:
  cases: int = 0
  typed: int = 0
  loads: int = 0
  by_format: dict[str, collections.Counter] = field(
    default_factory=lambda: collections.defaultdict(collections.Counter))
  failures: list[tuple[str, str, str]] = field(default_factory=list)  # (label, kind, detail)
  def add(self, case: Case, kind: str, detail: str) -> None:
    if case.label.endswith("seed") and kind == "typed": kind = "rejected-valid"  # an unmutated file must load
    self.cases += 1
    self.by_format[case.fmt][kind] += 1
    if kind == "typed": self.typed += 1
    elif kind == "load": self.loads += 1
    else: self.failures.append((f"{case.fmt}:{case.label}", kind, detail))
  def summary(self) -> str:
    per = "; ".join(f"{fmt} {sum(c.values())} ({c['typed']} typed errors, {c['load']} loads)"
                    for fmt, c in sorted(self.by_format.items()))
    return (f"loader fuzz: {self.cases} cases, {self.typed} typed errors, {self.loads} loads, {len(self.failures)} "
            f"failures (foreign exceptions, crashes, hangs, accepted-invalid or mismatching files) -- {per}")

# ** seed files **

def safetensors_seeds() -> list[bytes]:
  from safetensors.numpy import save
  rng = np.random.default_rng(0)
  a = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": np.arange(-2, 3, dtype=np.int64),
       "c": rng.standard_normal(7).astype(np.float16), "d": np.zeros((0, 3), np.uint8)}
  b = {"x": np.array([[True, False], [False, True]]), "y": np.array([7], np.int32)}
  return [save(a, metadata={"format": "pt"}), save(b)]

def gguf_reference_seed() -> bytes:
  import gguf
  rng = np.random.default_rng(1)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "seed.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("test.count", 3)
    writer.add_string("test.name", "seed")
    writer.add_array("test.ids", [1, -2, 3])
    writer.add_tensor("f32", rng.standard_normal((2, 4)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((3, 8)).astype(np.float16))
    q8 = rng.integers(0, 256, (2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(0.25).tobytes(), np.uint8)
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "rb") as f: return f.read()

@dataclass
class GGUFSeed:
  """A GGUF file and the position, width and name of each integer field of its header."""
  data: bytes
  fields: list[tuple[int, str, str]]  # (offset, struct format, field name)

def gguf_seed(metadata: list[tuple[str, int, Any]], tensors: list[tuple[str, int, tuple[int, ...], bytes]],
              alignment: int = 32) -> GGUFSeed:
  """metadata: (key, value type id, value) with values of type 4 (uint32), 8 (string) or 9 (array of uint32);
  tensors: (name, ggml type id, GGUF dims innermost first, raw bytes)."""
  out, fields = bytearray(), []
  def put(fmt: str, value: int, name: str) -> None:
    fields.append((len(out), fmt, name))
    out.extend(struct.pack("<" + fmt, value))
  def string(s: str, name: str) -> None:
    put("Q", len(s.encode()), f"length of {name}")
    out.extend(s.encode())
  out += b"GGUF"
  put("I", 3, "version")
  put("Q", len(tensors), "tensor count")
  put("Q", len(metadata), "metadata count")
  for key, vtype, value in metadata:
    string(key, f"key {key}")
    put("I", vtype, f"type of {key}")
    if vtype == 4: put("I", value, f"value of {key}")
    elif vtype == 8: string(value, f"value of {key}")
    else:
      put("I", 4, f"element type of {key}")
      put("Q", len(value), f"count of {key}")
      for i, v in enumerate(value): put("I", v, f"{key}[{i}]")
  offset, blobs = 0, []
  for name, gtype, dims, raw in tensors:
    string(name, f"name of {name}")
    put("I", len(dims), f"rank of {name}")
    for i, d in enumerate(dims): put("Q", d, f"dim {i} of {name}")
    put("I", gtype, f"type of {name}")
    put("Q", offset, f"offset of {name}")
    blobs.append(raw)
    offset += -(-len(raw) // alignment) * alignment
  out += b"\0" * (-len(out) % alignment)
  for raw in blobs: out += raw + b"\0" * (-len(raw) % alignment)
  return GGUFSeed(bytes(out), fields)

def gguf_own_seed() -> GGUFSeed:
  rng = np.random.default_rng(2)
  f32 = rng.standard_normal((2, 4)).astype(np.float32).tobytes()
  q80 = bytearray(rng.integers(0, 256, 2 * 34, dtype=np.uint8).tobytes())
  for b in range(2): q80[b * 34:b * 34 + 2] = np.float16(0.5).tobytes()
  q4k = bytearray(rng.integers(0, 256, 144, dtype=np.uint8).tobytes())
  q4k[0:4] = np.array([0.125, 0.0625], np.float16).tobytes()
  md = [("general.alignment", 4, 32), ("general.name", 8, "fuzz"), ("test.list", 9, [5, 6, 7])]
  return gguf_seed(md, [("w", 0, (4, 2), f32), ("q", 8, (32, 2), bytes(q80)), ("k", 12, (256,), bytes(q4k))])

def pth_seeds() -> list[bytes]:
  import torch
  g = torch.Generator().manual_seed(3)
  base = torch.randn(4, 3, generator=g)
  plain = {"w": torch.randn(3, 4, generator=g), "t": base.t(), "i": torch.arange(5), "h": torch.randn(6, generator=g)
           .half(), "e": torch.randn(3, 1, generator=g).expand(3, 2), "s": base[1:3, 1:], "meta": {"x": [torch.ones(2),
           3], "name": "seed"}}
  torch.manual_seed(4)
  module = torch.nn.Linear(3, 2).state_dict()  # an OrderedDict with _metadata (pickled with BUILD)
  out = []
  for obj in (plain, module):
    buf = io.BytesIO()
    torch.save(obj, buf)
    out.append(buf.getvalue())
  return out

# ** mutations **

def truncate(rng: random.Random, data: bytes) -> bytes:
  cut = rng.choice([rng.randrange(len(data)), rng.randrange(min(len(data), 256)), len(data) - rng.randint(1, 64)])
  return data[:max(cut, 0)]

def flip(rng: random.Random, data: bytes, region: int | None = None) -> bytes:
  out = bytearray(data)
  span = min(len(out), region or len(out))
  for _ in range(rng.choice([1, 1, 2, 4, 8])):
    at = rng.randrange(span)
    out[at] = rng.choice([out[at] ^ (1 << rng.randrange(8)), rng.randrange(256), 0, 0xFF])
  return bytes(out)

def awkward(rng: random.Random, width_bits: int) -> int:
  values = [v for v in AWKWARD_INTS if v < 2**width_bits] + [2**width_bits - 1, rng.randrange(2**width_bits)]
  return rng.choice(values)

def _st_bytes(header: Any, data: bytes, raw_header: bytes | None = None) -> bytes:
  h = raw_header if raw_header is not None else json.dumps(header).encode()
  return struct.pack("<Q", len(h)) + h + data

def safetensors_field(rng: random.Random, seed: bytes) -> tuple[str, bytes]:
  n = struct.unpack("<Q", seed[:8])[0]
  header, data = json.loads(seed[8:8 + n]), seed[8 + n:]
  names = [k for k in header if k != "__metadata__"]
  name = rng.choice(names)
  entry = header[name]
  what = rng.choice(["shape", "shape", "offsets", "offsets", "dtype", "entry", "metadata", "duplicate", "length"])
  if what == "shape":
    shape = list(entry["shape"])
    choice = rng.randrange(4)
    if choice == 0 and shape: shape[rng.randrange(len(shape))] = rng.choice([-1, 0, 2**31, 2**63, 2**64, 2**70, 1.5])
    elif choice == 1: shape.append(rng.choice([0, 1, 2, 2**62]))
    elif choice == 2: shape = rng.choice([[], [True], "3", None, [[1]], [0, 2**70]])
    elif shape: shape.pop()
    entry["shape"] = shape
  elif what == "offsets":
    b, e = entry["data_offsets"]
    entry["data_offsets"] = rng.choice([[e, b], [b, e + 1], [b - 1, e], [0, e - b], [b, 2**64], [-1, e], [b], [b, e, 0],
                                        [str(b), e], [b + rng.randint(1, 8), e + rng.randint(1, 8)], None])
  elif what == "dtype":
    entry["dtype"] = rng.choice(["F64", "I8", "U64", "BF16", "F8_E4M3", "Q4", "", None, ["F32"], "f32", 32])
  elif what == "entry":
    header[name] = rng.choice([None, [], "x", {"dtype": entry["dtype"]}, {**entry, "extra": 1}])
  elif what == "metadata":
    header["__metadata__"] = rng.choice([None, [], {"k": 1}, {"k": None}, "x", {"k": "v" * 100}])
  elif what == "duplicate":  # the same name twice, as raw JSON (a dict cannot hold it)
    other = rng.choice(names)
    body = json.dumps(header)[:-1] + ", " + json.dumps(name) + ": " + json.dumps(header[other]) + "}"
    return f"dup {name}", _st_bytes(None, data, body.encode())
  else:
    raw = json.dumps(header).encode()
    return "header length", struct.pack("<Q", awkward(rng, 64)) + raw + data
  return f"{what} of {name}", _st_bytes(header, data)

def gguf_field(rng: random.Random, seed: GGUFSeed) -> tuple[str, bytes]:
  offset, fmt, name = rng.choice(seed.fields)
  value = awkward(rng, 8 * struct.calcsize(fmt))
  out = bytearray(seed.data)
  out[offset:offset + struct.calcsize(fmt)] = struct.pack("<" + fmt, value)
  return f"{name}={value}", bytes(out)

def _rezip(seed: bytes, edit: Callable[[str, bytes], bytes]) -> bytes:
  """The checkpoint with each member's bytes passed through `edit` (stored, as torch writes them)."""
  src = zipfile.ZipFile(io.BytesIO(seed))
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist(): dst.writestr(info.filename, edit(info.filename, src.read(info.filename)))
  return buf.getvalue()

def pickle_field(rng: random.Random, seed: bytes) -> tuple[str, bytes]:
  """An integer inside data.pkl (a size, stride, offset, numel, memo index) set to an awkward value."""
  def edit(name: str, data: bytes) -> bytes:
    if not name.endswith("data.pkl"): return data
    ints = [(pos, op.name) for op, _, pos in pickletools.genops(data)
            if op.name in ("BININT1", "BININT2", "BININT", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET")]
    pos, op = rng.choice(ints)
    width = {"BININT1": 1, "BININT2": 2, "BININT": 4, "BINPUT": 1, "LONG_BINPUT": 4, "BINGET": 1,
             "LONG_BINGET": 4}[op]
    value = rng.choice([awkward(rng, 8 * width), 2**(8 * width) - 1])
    edit.label = f"{op}@{pos}={value}"  # type: ignore[attr-defined]
    if rng.random() < 0.2 and op.startswith("BININT"):  # a wider integer in place of a small one (LONG1, 8 bytes)
      big = rng.choice([-1, -2**63, 2**63, 2**70])
      size = (big.bit_length() + 8) // 8
      edit.label = f"{op}@{pos}=LONG1 {big}"  # type: ignore[attr-defined]
      return data[:pos] + b"\x8a" + bytes([size]) + big.to_bytes(size, "little", signed=True) + data[pos + 1 + width:]
    return data[:pos + 1] + value.to_bytes(width, "little") + data[pos + 1 + width:]
  edit.label = ""  # type: ignore[attr-defined]
  out = _rezip(seed, edit)
  return f"pickle int {edit.label}", out  # type: ignore[attr-defined]

def pickle_bytes(rng: random.Random, seed: bytes) -> tuple[str, bytes]:
  """data.pkl truncated or with flipped bytes, inside a well-formed zip."""
  kind = rng.choice(["truncate", "flip"])
  def edit(name: str, data: bytes) -> bytes:
    if not name.endswith("data.pkl"): return data
    return truncate(rng, data) if kind == "truncate" else flip(rng, data)
  return f"pickle {kind}", _rezip(seed, edit)

def zip_field(rng: random.Random, seed: bytes) -> tuple[str, bytes]:
  """A field of a central directory entry, a local header or the end record set to an awkward value."""
  out = bytearray(seed)
  central = [i for i in range(len(out) - 4) if out[i:i + 4] == b"PK\x01\x02"]
  local = [i for i in range(len(out) - 4) if out[i:i + 4] == b"PK\x03\x04"]
  end = out.rfind(b"PK\x05\x06")
  where = rng.choice(["central", "central", "local", "end"])
  if where == "central":
    base = rng.choice(central)
    off, fmt = rng.choice([(10, "H"), (20, "I"), (24, "I"), (28, "H"), (30, "H"), (42, "I"), (8, "H")])
  elif where == "local":
    base = rng.choice(local)
    off, fmt = rng.choice([(8, "H"), (18, "I"), (22, "I"), (26, "H"), (28, "H")])
  else:
    base = end
    off, fmt = rng.choice([(8, "H"), (10, "H"), (12, "I"), (16, "I"), (20, "H")])
  value = awkward(rng, 8 * struct.calcsize(fmt))
  out[base + off:base + off + struct.calcsize(fmt)] = struct.pack("<" + fmt, value)
  return f"zip {where}@{base}+{off}={value}", bytes(out)

# ** targeted cases: the files that escaped before (issue 24) **

def _pickle_checkpoint(seed: bytes, payload: bytes) -> bytes:
  return _rezip(seed, lambda name, data: payload if name.endswith("data.pkl") else data)

def _tensor_pickle(size: Any, stride: Any, offset: Any = 0, numel: int = 12) -> bytes:
  """A pickle of {"w": _rebuild_tensor_v2(storage '0' (FloatStorage of `numel`), offset, size, stride, ...)}, written
  opcode by opcode so that any value can be put in (protocol 2)."""
  def obj(v: Any) -> bytes: return pickle.dumps(v, protocol=2)[2:-1]  # drop PROTO and STOP
  storage = (b"(" + obj("storage") + b"ctorch\nFloatStorage\n" + obj("0") + obj("cpu") + obj(numel) + b"tQ")
  args = b"(" + storage + obj(offset) + obj(size) + obj(stride) + b"\x89" + b"ccollections\nOrderedDict\n)R" + b"t"
  return b"\x80\x02}" + obj("w") + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"Rs."

def targeted_cases(st_seed: bytes, gguf: GGUFSeed, pth_seed: bytes) -> list[Case]:
  cases = []
  f32 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
  st = [
    ("deep JSON", _st_bytes(None, b"", b"[" * 50_000 + b"]" * 50_000)),
    ("5000-digit int", _st_bytes(None, b"\0" * 4, b'{"a": {"dtype": "F32", "shape": [' + b"7" * 5000 +
                                 b'], "data_offsets": [0, 4]}}')),
    ("shape [0, 2**70]", _st_bytes({"a": {"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}}, b"")),
    ("duplicate names", _st_bytes(None, b"\0" * 4, b'{"a": ' + json.dumps(f32).encode() + b', "a": ' +
                                  json.dumps(f32).encode() + b"}")),
    ("overlapping ranges", _st_bytes({"a": f32, "b": f32}, b"\0" * 4)),
    ("huge header length", struct.pack("<Q", 2**64 - 1) + st_seed[8:]),
  ]
  cases += [Case("safetensors", label, data) for label, data in st]
  def gguf_with(metadata: list[tuple[str, int, Any]] | None = None, raw_kv: bytes | None = None,
                tensors: list[tuple[str, int, tuple[int, ...], bytes]] | None = None) -> bytes:
    base = gguf_seed(metadata or [], tensors if tensors is not None else [("w", 0, (2,), b"\0" * 8)]).data
    if raw_kv is None: return base
    # one more key/value pair spliced in after the counts (metadata count + 1)
    n_kv = struct.unpack("<Q", base[16:24])[0]
    return base[:16] + struct.pack("<Q", n_kv + 1) + raw_kv + base[24:]
  def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload
  nested = struct.pack("<IQ", 9, 1) * 20_000 + struct.pack("<IQ", 4, 0)  # arrays of arrays, 20000 deep
  gg = [
    ("alignment as a string", gguf_with(raw_kv=kv("general.alignment", 8, struct.pack("<Q", 2) + b"32"))),
    ("alignment as a float", gguf_with(raw_kv=kv("general.alignment", 6, struct.pack("<f", 32.0)))),
    ("alignment as uint64", gguf_with(raw_kv=kv("general.alignment", 10, struct.pack("<Q", 32)))),
    ("alignment 0", gguf_with([("general.alignment", 4, 0)])),
    ("alignment 3", gguf_with([("general.alignment", 4, 3)])),
    ("nested arrays", gguf_with(raw_kv=kv("deep", 9, nested))),
    ("dims wrapping to 0", gguf_with(tensors=[("w", 0, (2**32, 2**32), b"")])),
    ("dims wrapping to 4", gguf_with(tensors=[("w", 0, (2**62 + 1, 4), b"\0" * 16)])),
    ("duplicate tensor names", gguf_with(tensors=[("w", 0, (2,), b"\0" * 8), ("w", 0, (2,), b"\0" * 8)])),
    ("duplicate keys", gguf_with([("k", 4, 1), ("k", 4, 2)])),
    ("unknown tensor type", gguf_with(tensors=[("w", 99, (2,), b"\0" * 8)])),
  ]
  overlap = bytearray(gguf_with(tensors=[("a", 0, (8,), b"\0" * 32), ("b", 0, (8,), b"\0" * 32)]))
  at = overlap.find(b"\x01\x00\x00\x00\x00\x00\x00\x00b") + 9  # name "b": rank, dim, type, then its offset
  overlap[at + 4 + 8 + 4:at + 4 + 8 + 4 + 8] = struct.pack("<Q", 0)
  gg.append(("overlapping tensors", bytes(overlap)))
  cases += [Case("gguf", label, data) for label, data in gg]
  method_99 = bytearray(pth_seed)
  entry = method_99.find(b"PK\x01\x02")
  method_99[entry + 10] = 99
  pt = [
    ("not a zip", b"PK\x03\x04" + b"\0" * 60),
    ("truncated", pth_seed[:len(pth_seed) // 2]),
    ("compression method 99", bytes(method_99)),
    ("size (-1, 2)", _pickle_checkpoint(pth_seed, _tensor_pickle((-1, 2), (2, 1)))),
    ("size (2**62, 2**62)", _pickle_checkpoint(pth_seed, _tensor_pickle((2**62, 2**62), (0, 0)))),
    ("size 2**70", _pickle_checkpoint(pth_seed, _tensor_pickle((2**70,), (1,)))),
    ("negative offset", _pickle_checkpoint(pth_seed, _tensor_pickle((2,), (1,), offset=-1))),
    ("numel -1", _pickle_checkpoint(pth_seed, _tensor_pickle((2,), (1,), numel=-1))),
    ("stride past storage", _pickle_checkpoint(pth_seed, _tensor_pickle((2, 2), (100, 1)))),
    ("BINBYTES8 of 2**62", _pickle_checkpoint(pth_seed, b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"x.")),
    ("memo index 2**31", _pickle_checkpoint(pth_seed, b"\x80\x02]r" + struct.pack("<I", 2**31 - 1) + b".")),
    ("5000-digit LONG", _pickle_checkpoint(pth_seed, b"\x80\x02L" + b"9" * 5000 + b"L\n.")),
    ("os.system", _pickle_checkpoint(pth_seed, b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.")),
  ]
  cases += [Case("pth", label, data) for label, data in pt]
  return cases

def make_cases(n: int, seed: int = 0) -> list[Case]:
  """`n` mutated files (about a third per format) after the targeted cases, all from `seed`."""
  rng = random.Random(seed)
  st_seeds, pth = safetensors_seeds(), pth_seeds()
  own, ref = gguf_own_seed(), gguf_reference_seed()
  cases = targeted_cases(st_seeds[0], own, pth[0])
  cases += [Case("safetensors", "seed", s) for s in st_seeds] + [Case("gguf", "seed", own.data),
            Case("gguf", "reference seed", ref)] + [Case("pth", "seed", s) for s in pth]
  while len(cases) < n:
    i = len(cases)
    fmt = ("safetensors", "gguf", "pth")[i % 3]
    how = rng.choice(["truncate", "flip", "header", "field", "field"])
    if fmt == "safetensors":
      s = rng.choice(st_seeds)
      if how == "truncate": label, data = "truncate", truncate(rng, s)
      elif how == "flip": label, data = "flip", flip(rng, s)
      elif how == "header": label, data = "flip header", flip(rng, s, 8 + struct.unpack("<Q", s[:8])[0])
      else: label, data = safetensors_field(rng, s)
    elif fmt == "gguf":
      g = own if rng.random() < 0.7 else GGUFSeed(ref, [])
      if how == "truncate": label, data = "truncate", truncate(rng, g.data)
      elif how == "flip": label, data = "flip", flip(rng, g.data)
      elif how == "header" or not g.fields: label, data = "flip header", flip(rng, g.data, 256)
      else: label, data = gguf_field(rng, g)
    else:
      p = rng.choice(pth)
      if how == "truncate": label, data = "truncate", truncate(rng, p)
      elif how == "flip": label, data = "flip", flip(rng, p)
      elif how == "header": label, data = pickle_bytes(rng, p)
      else: label, data = rng.choice([pickle_field, pickle_field, zip_field])(rng, p)
    cases.append(Case(fmt, f"#{i} {label}", data))
  return cases

# ** checking one case (in a worker process) **

class CaseTimeout(BaseException):
  """The case ran past CASE_SECONDS (a BaseException, so no handler in the code under test swallows it)."""

def _alarm(signum: int, frame: Any) -> None: raise CaseTimeout()

def init_worker() -> None:
  """DEV=PYTHON before ember is imported here, and every module the cases use imported before the first alarm (on a
  loaded machine importing torch alone can outlast a case's bound)."""
  os.environ["DEV"] = "PYTHON"
  import gguf  # noqa: F401
  import safetensors.torch  # noqa: F401
  import torch  # noqa: F401
  import ember.nn.gguf  # noqa: F401
  import ember.nn.pth  # noqa: F401
  import ember.nn.state  # noqa: F401
  signal.signal(signal.SIGALRM, _alarm)

class Mismatch(Exception):
  """Ember loaded the file, and the reference disagrees."""

def _equal(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
  if ours.shape != ref.shape or ours.dtype != ref.dtype:
    raise Mismatch(f"{what}: {ours.dtype}{ours.shape} vs the reference's {ref.dtype}{ref.shape}")
  if not np.array_equal(ours, ref, equal_nan=ours.dtype.kind == "f"):
    raise Mismatch(f"{what}: values differ from the reference's")

def check_safetensors(path: str) -> None:
  from ember import dtypes
  from ember.nn.state import safe_load
  uint = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
  def raw(t: Any) -> np.ndarray:  # a bool is compared as a bool: a byte other than 0 and 1 reads as True
    return (t.numpy() if t.dtype is dtypes.bool else t.bitcast(uint[t.dtype.itemsize]).numpy()).reshape(-1)
  ours = {k: (v.shape, raw(v)) for k, v in safe_load(path).items()}
  import torch
  from safetensors.torch import load  # the torch flavour reads every dtype (numpy has no bfloat16 or float8)
  try:
    with open(path, "rb") as f: ref = load(f.read())
  except Exception as e: raise Mismatch(f"ember loaded a file the reference refuses: {type(e).__name__}: {e}") from e
  if set(ours) != set(ref): raise Mismatch(f"tensors {sorted(ours)} vs the reference's {sorted(ref)}")
  for k, (shape, got) in ours.items():
    if shape != tuple(ref[k].shape): raise Mismatch(f"{k}: shape {shape} vs the reference's {tuple(ref[k].shape)}")
    ref_bytes = ref[k].contiguous().reshape(-1).view(torch.uint8).numpy()
    _equal(got, ref_bytes != 0 if got.dtype == np.bool_ else ref_bytes.view(got.dtype), f"values of {k}")

def check_gguf(path: str) -> None:
  from ember.nn.gguf import GGUFFile
  f = GGUFFile(path)
  raw = {name: f.raw_tensor(name).numpy() for name in f.tensors}
  values = {name: f.tensor(name) for name in f.tensors}
  import gguf
  try: reader = gguf.GGUFReader(path)
  except Exception as e: raise Mismatch(f"ember loaded a file the reference refuses: {type(e).__name__}: {e}") from e
  ref = {t.name: t for t in reader.tensors}
  if set(ref) != set(raw): raise Mismatch(f"tensors {sorted(raw)} vs the reference's {sorted(ref)}")
  spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in reader.tensors if t.n_bytes)
  if any(b < e for (_, e), (b, _) in zip(spans, spans[1:])): raise Mismatch("ember loaded overlapping tensors")
  for name, t in ref.items():
    ref_bytes = np.asarray(t.data).reshape(-1).view(np.uint8)
    _equal(raw[name], ref_bytes, f"bytes of {name}")
    if ref_bytes.size == 0: expected = np.zeros(0, np.float32)  # the reference's dequantize needs a block
    elif t.tensor_type.name in ("F32", "F16"): expected = np.asarray(t.data, np.float32)
    else: expected = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    _equal(values[name], expected.reshape(f.tensors[name].shape).astype(np.float32), f"values of {name}")
  for key, value in f.metadata.items():
    field = reader.fields.get(key)
    if field is None: raise Mismatch(f"metadata {key!r} is missing from the reference's")
    if isinstance(value, (int, str)) and not isinstance(value, bool) and field.contents() != value:
      raise Mismatch(f"metadata {key!r}: {value!r:.80} vs the reference's {field.contents()!r:.80}")

def _compare_pth(ours: Any, ref: Any, where: str) -> None:
  import torch
  from ember import Tensor
  if isinstance(ref, torch.Tensor):
    if not isinstance(ours, Tensor): raise Mismatch(f"{where}: {type(ours).__name__} where torch has a tensor")
    _equal(ours.numpy(), ref.detach().numpy(), where)
  elif isinstance(ref, dict):
    if not isinstance(ours, dict) or list(ours) != list(ref): raise Mismatch(f"{where}: keys differ")
    for k in ref: _compare_pth(ours[k], ref[k], f"{where}[{k!r}]")
  elif isinstance(ref, (list, tuple)):
    if type(ours) is not type(ref) or len(ours) != len(ref): raise Mismatch(f"{where}: containers differ")
    for i, (a, b) in enumerate(zip(ours, ref)): _compare_pth(a, b, f"{where}[{i}]")
  elif type(ours) is not type(ref) or ours != ref: raise Mismatch(f"{where}: {ours!r:.80} vs torch's {ref!r:.80}")

def check_pth(path: str) -> None:
  from ember.nn.pth import torch_load
  ours = torch_load(path)
  import torch
  try: ref = torch.load(path, weights_only=True, map_location="cpu")
  except Exception as e: raise Mismatch(f"ember loaded a file torch refuses: {type(e).__name__}: {e}") from e
  _compare_pth(ours, ref, "checkpoint")

CHECKS = {"safetensors": check_safetensors, "gguf": check_gguf, "pth": check_pth}

def run_case(case: Case, tmp: str) -> tuple[str, str]:
  """("typed" | "load" | "foreign" | "hang" | "mismatch" | "untyped-message", detail) for one case."""
  from ember.nn.weightfile import WeightFormatError
  path = os.path.join(tmp, f"case.{case.fmt}")
  with open(path, "wb") as f: f.write(case.data)
  signal.alarm(CASE_SECONDS)
  try:
    CHECKS[case.fmt](path)
    return "load", ""
  except WeightFormatError as e:
    if path not in str(e): return "untyped-message", f"the error does not name the file: {e}"
    return "typed", type(e).__name__
  except Mismatch as e: return "mismatch", str(e)
  except CaseTimeout: return "hang", f"ran past {CASE_SECONDS} s"
  except Exception: return "foreign", traceback.format_exc(limit=6)
  finally: signal.alarm(0)

def run_chunk(cases: list[Case]) -> list[tuple[str, str]]:
  with tempfile.TemporaryDirectory() as tmp: return [run_case(c, tmp) for c in cases]

def _pool(workers: int) -> ProcessPoolExecutor:
  # spawn, not fork: the parent holds torch's threads
  return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker)

def run_cases(cases: list[Case], workers: int = 2, chunk: int = 25) -> Report:
  """Run every case in `workers` processes. When a worker dies (a crash) the unfinished chunks run again one at a
  time, so that the crash is charged to its own chunk; a chunk that does not finish (a hang the alarm could not
  interrupt) fails every case in it."""
  chunks = [cases[i:i + chunk] for i in range(0, len(cases), chunk)]
  results: dict[int, list[tuple[str, str]]] = {}
  def wait(future: Any, part: list[Case]) -> list[tuple[str, str]] | None:
    try: return future.result(timeout=CASE_SECONDS * len(part) + 120)
    except FutureTimeout: return [("hang", f"the chunk {part[0].label} .. {part[-1].label} did not finish")] * len(part)
    except BrokenProcessPool: return None
  pool = _pool(workers)
  try:
    futures = [pool.submit(run_chunk, part) for part in chunks]
    for i, (part, future) in enumerate(zip(chunks, futures)):
      if (got := wait(future, part)) is not None: results[i] = got
  finally: pool.shutdown(wait=False, cancel_futures=True)
  for i, part in enumerate(chunks):  # after a crash: alone, in a fresh process each
    if i in results: continue
    with _pool(1) as alone:
      got = wait(alone.submit(run_chunk, part), part)
    results[i] = got or [("crash", f"a worker died in the chunk {part[0].label} .. {part[-1].label}")] * len(part)
  report = Report()
  for i, part in enumerate(chunks):
    for case, (kind, detail) in zip(part, results[i]): report.add(case, kind, detail)
  return report
