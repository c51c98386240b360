"""llama, qwen2 and qwen3 GGUFs in every kept weight type against transformers loading the same file (its GGUF loader
dequantises with the `gguf` package): logits to 1e-3 and greedy ids exactly. The files are written with the `gguf`
package: random weights quantised by it, or random well-formed blocks for the k-quants it cannot quantise."""
from __future__ import annotations
import pathlib
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from ember.nn.llm.model import Llama  # noqa: E402
from ember.nn.llm.quant import HalfWeight, QuantWeight  # noqa: E402

DIM, FFN, VOCAB, LAYERS, HEADS, KV_HEADS = 256, 256, 256, 2, 2, 1  # k-quants need rows of a multiple of 256
HEAD_DIM = DIM // HEADS
QUANTISED_BY_GGUF = ("Q4_0", "Q4_1", "Q8_0", "F16", "BF16")
# the largest magnitude of a k-quant block's float16 super-scale (d) and min scale (dmin): weights then stay ~0.1
K_SCALE = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 4e-5}
K_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the float16 scales in a block
IDS = [3, 17, 250, 9, 128, 77, 4]

def _blocks(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
  """Random well-formed `kind` blocks for a (rows, cols) matrix, as (rows, bytes per row) uint8."""
  qtype = gguf.GGMLQuantizationType[kind]
  block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
  blocks = rng.integers(0, 256, (shape[0] * shape[1] // block_elems, block_bytes), dtype=np.uint8)
  for at in K_FIELDS[kind]:
    scales = rng.uniform(0, K_SCALE[kind], len(blocks)).astype(np.float16)
    blocks[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
  return blocks.reshape(shape[0], -1)

def _matrix(kind: str, w: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, object]:
  if kind in QUANTISED_BY_GGUF:
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.quantize(w, qtype), qtype
  return _blocks(kind, w.shape, rng), gguf.GGMLQuantizationType[kind]

def write_model(path: pathlib.Path, arch: str, kind: str, tied: bool, seed: int = 0) -> pathlib.Path:
  """A random 2-layer GQA model of `arch` with its matrices in `kind` (norms float32) written by gguf's writer."""
  rng = np.random.default_rng(seed)
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_context_length(64)
  writer.add_embedding_length(DIM)
  writer.add_block_count(LAYERS)
  writer.add_feed_forward_length(FFN)
  writer.add_head_count(HEADS)
  writer.add_head_count_kv(KV_HEADS)
  writer.add_rope_freq_base(10000.0)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_vocab_size(VOCAB)
  if arch == "qwen3": writer.add_key_length(HEAD_DIM)
  writer.add_file_type(0)
  kv = KV_HEADS * HEAD_DIM
  def matrix(name: str, rows: int, cols: int) -> None:
    data, qtype = _matrix(kind, (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32), rng)
    writer.add_tensor(name, data, raw_dtype=qtype)
  def vector(name: str, n: int, around: float) -> None:
    writer.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))
  matrix("token_embd.weight", VOCAB, DIM)
  if not tied: matrix("output.weight", VOCAB, DIM)
  vector("output_norm.weight", DIM, 1.0)
  for i in range(LAYERS):
    p = f"blk.{i}."
    vector(p + "attn_norm.weight", DIM, 1.0)
    vector(p + "ffn_norm.weight", DIM, 1.0)
    matrix(p + "attn_q.weight", HEADS * HEAD_DIM, DIM)
    matrix(p + "attn_k.weight", kv, DIM)
    matrix(p + "attn_v.weight", kv, DIM)
    matrix(p + "attn_output.weight", DIM, HEADS * HEAD_DIM)
    matrix(p + "ffn_gate.weight", FFN, DIM)
    matrix(p + "ffn_up.weight", FFN, DIM)
    matrix(p + "ffn_down.weight", DIM, FFN)
    if arch == "qwen2":
      for n, size in (("q", HEADS * HEAD_DIM), ("k", kv), ("v", kv)): vector(p + f"attn_{n}.bias", size, 0.0)
    if arch == "qwen3":
      vector(p + "attn_q_norm.weight", HEAD_DIM, 1.0)
      vector(p + "attn_k_norm.weight", HEAD_DIM, 1.0)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path

def reference(path: pathlib.Path, ids: list[int], new_tokens: int) -> tuple[np.ndarray, list[int]]:
  """transformers on the same file: the logits of every position of `ids` (T, vocab) and `new_tokens` greedy ids."""
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32)
  model.eval()
  with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0].double().numpy()
    seq = list(ids)
    for _ in range(new_tokens): seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
  return logits, seq[len(ids):]

ARCHS = ("llama", "qwen2", "qwen3")
KINDS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "F16", "BF16")
# the fast run covers every weight type and every architecture once (a diagonal through the grid); the `slow`
# session runs the whole grid
DIAGONAL = [(ARCHS[i % len(ARCHS)], kind) for i, kind in enumerate(KINDS)]
CASES = DIAGONAL + [pytest.param(arch, kind, marks=pytest.mark.slow) for arch in ARCHS for kind in KINDS
                    if (arch, kind) not in DIAGONAL]

@pytest.mark.parametrize("arch,kind", CASES)
def test_architecture_and_weight_type_match_transformers(tmp_path, arch, kind):
  tied = arch != "qwen2"  # qwen2 with its own LM head, the others tied to the embedding
  path = write_model(tmp_path / f"{arch}-{kind}.gguf", arch, kind, tied)
  ref_logits, ref_greedy = reference(path, IDS, 5)
  # a float32 cache: transformers keeps its keys and values unrounded (test_model checks the float16 cache)
  model = Llama.from_gguf(path, max_context=32, kv_dtype="float32")
  assert isinstance(model.layers[0].qkv, HalfWeight if kind in ("F16", "BF16") else QuantWeight)  # kept as stored
  np.testing.assert_allclose(model.forward(IDS[:4]), ref_logits[3], rtol=1e-3, atol=1e-3)
  for t in range(4, len(IDS)):  # the captured decode step, one token at a time
    np.testing.assert_allclose(model.forward([IDS[t]]), ref_logits[t], rtol=1e-3, atol=1e-3)
  model.reset()
  from ember.nn.llm.generate import generate
  assert generate(model, IDS, 5) == ref_greedy
