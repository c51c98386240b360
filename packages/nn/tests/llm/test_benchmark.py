"""`ember-llm --benchmark`: prefill and decode at several context lengths, the bytes a decode step reads, and the
prefill chunking the warm-up follows."""
from __future__ import annotations
import io
import math
import pytest
from ember.nn.llm import __main__ as cli
from ember.nn.llm.benchmark import context_prompt, run_context_benchmark
from ember.nn.llm.model import PREFILL_BUCKETS, Llama, ModelError, prefill_chunks

@pytest.mark.parametrize("tokens", [1, 7, PREFILL_BUCKETS[-1], PREFILL_BUCKETS[-1] + 1, 3 * PREFILL_BUCKETS[-1] + 5])
def test_prefill_chunks_cover_the_prompt(tokens):
  big = PREFILL_BUCKETS[-1]
  chunks = prefill_chunks(tokens)
  assert len(chunks) == math.ceil(tokens / big) and all(c == big for c in chunks[:-1])
  rest = tokens - big * (len(chunks) - 1)
  assert chunks[-1] == min(b for b in PREFILL_BUCKETS if b >= rest)

def test_context_prompt_repeats_the_prompt():
  assert context_prompt([5, 6, 7], 7) == [5, 6, 7, 5, 6, 7, 5]
  assert context_prompt([5, 6, 7], 2) == [5, 6]
  with pytest.raises(ModelError, match="at least one token"): context_prompt([], 4)

def test_context_benchmark_on_tiny_model(tiny_llama):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=64, quantized=False)
  results = run_context_benchmark(model, [3, 4, 5], (9, 40), decode_tokens=4, runs=1)
  assert [r.context for r in results] == [9, 40]
  matrices = sum(w.size for name, w in hf.items() if w.ndim == 2 and name != "token_embd.weight")
  norms = sum(w.size for w in hf.values() if w.ndim == 1)
  tied_head = hf["token_embd.weight"].size  # the tiny model has no output.weight: the LM head is the embedding
  weights = 4 * (matrices + norms + tied_head)
  kv = cfg["n_kv_heads"] * cfg["dim"] // cfg["n_heads"]
  for r in results:
    assert r.prefill_ms > 0 and r.decode_tokens_per_s > 0
    mean_position = r.context + 1  # decode steps at positions context, context + 1, context + 2
    assert r.bytes_per_token == weights + cfg["n_layers"] * mean_position * 2 * kv * 2  # a float16 cache
    assert r.decode_bytes_per_s == pytest.approx(r.bytes_per_token * r.decode_tokens_per_s)
    assert f"context {r.context}: prefill" in r.line() and "GB/s" in r.line()
  assert model.pos == 40 + 4 - 1  # the last run's prompt and every generated token but the last are cached

def test_context_benchmark_rejects_what_does_not_fit(tiny_llama):
  path, _, _ = tiny_llama
  model = Llama.from_gguf(path, max_context=32)
  with pytest.raises(ModelError, match="raise --max-context"): run_context_benchmark(model, [3], (30,), 4, 1)
  with pytest.raises(ModelError, match="decode_tokens >= 2"): run_context_benchmark(model, [3], (8,), 1, 1)
  with pytest.raises(ModelError, match="context lengths >= 1"): run_context_benchmark(model, [3], (), 4, 1)

def test_cli_benchmark_prints_each_context(tiny_llama):
  path, _, _ = tiny_llama
  out, err = io.StringIO(), io.StringIO()
  argv = ["--model", str(path), "--benchmark", "--contexts", "8,20", "--max-tokens", "3", "--runs", "1",
          "--max-context", "16"]  # raised to fit the longest context and its tokens
  assert cli.main(argv, out=out, err=err) == 0, err.getvalue()
  lines = out.getvalue().splitlines()
  assert [ln.split(":")[0] for ln in lines[:2]] == ["context 8", "context 20"]
  assert lines[2].startswith("bandwidth bound:")

def test_cli_benchmark_errors(tiny_llama):
  path, _, _ = tiny_llama
  err = io.StringIO()
  # the tiny model's own context length is 64
  assert cli.main(["--model", str(path), "--benchmark", "--contexts", "60", "--max-tokens", "8"], out=io.StringIO(),
                  err=err) == 1
  assert "exceed max_context" in err.getvalue() and "64" in err.getvalue()
  for bad in ("a,b", "8,0"):
    with pytest.raises(SystemExit):
      cli.main(["--model", str(path), "--benchmark", "--contexts", bad], out=io.StringIO(), err=io.StringIO())
