"""The KV cache's dtype (`Llama(kv_dtype=...)`, `ember-llm --kv-cache`): float16 by default, its rows rounded when
stored and widened inside the attention kernels, or float32; each against the numpy oracle (conftest's
`reference_logits`) with the keys and values rounded as that cache holds them, through prefill, decode steps and a
batched decode."""
from __future__ import annotations
import io
import numpy as np
import pytest
from ember.dtype import dtypes
from ember.nn.llm import __main__ as cli
from ember.nn.llm.model import Llama, ModelError

IDS = [5, 77, 200, 3, 150, 42, 9, 31, 64]
CACHES = [("float16", np.float16, dtypes.float16), ("float32", None, dtypes.float32)]

@pytest.mark.parametrize("kv_dtype,oracle,dtype", CACHES)
def test_prefill_and_decode_match_the_oracle_of_their_cache(tiny_llama, reference_logits, kv_dtype, oracle, dtype):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16, kv_dtype=kv_dtype)
  assert {layer.dtype for layer in model.cache.layers} == {dtype}
  ref = reference_logits(hf, cfg, IDS, oracle)
  np.testing.assert_allclose(model.forward(IDS[:4]), ref[3], rtol=1e-4, atol=1e-4)
  for t in range(4, len(IDS)):  # the captured decode step reads the rows the prefill and earlier steps stored
    np.testing.assert_allclose(model.forward([IDS[t]]), ref[t], rtol=1e-4, atol=1e-4)

def test_float16_rounding_is_what_the_oracle_checks(tiny_llama, reference_logits):
  # the tolerance above separates the two caches: rounding the keys and values moves the logits by more than it
  _, hf, cfg = tiny_llama
  rounded, exact = reference_logits(hf, cfg, IDS, np.float16), reference_logits(hf, cfg, IDS, None)
  assert not np.allclose(rounded[-1], exact[-1], rtol=1e-4, atol=1e-4)

def test_batched_decode_of_a_float16_cache(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  cache = model.new_cache(2)
  prompts = [IDS[:3], IDS[2:7]]
  for slot, ids in enumerate(prompts): model.forward(ids, cache, slot)
  nexts = [IDS[7], IDS[8]]
  got = model.decode_batch(nexts, [0, 1], cache)
  for row, ids, nxt in zip(got, prompts, nexts):
    np.testing.assert_allclose(row, reference_logits(hf, cfg, ids + [nxt], np.float16)[-1], rtol=1e-4, atol=1e-4)

def test_decode_bytes_count_the_cache_dtype(tiny_llama):
  path, _, _ = tiny_llama
  half, full = (Llama.from_gguf(path, max_context=16, kv_dtype=k) for k in ("float16", "float32"))
  per_position = half.cfg.n_layers * 2 * half.cfg.kv_dim
  assert half.decode_bytes(10) - half.weight_bytes == 10 * per_position * 2
  assert full.decode_bytes(10) - full.weight_bytes == 10 * per_position * 4

def test_unknown_cache_dtype_is_a_clear_error(tiny_llama):
  path, _, _ = tiny_llama
  with pytest.raises(ModelError, match="kv_dtype must be one of") as e: Llama.from_gguf(path, kv_dtype="bfloat16")
  assert isinstance(e.value, ValueError)

def test_cli_kv_cache_flag(tiny_llama, monkeypatch, capsys):
  path, _, _ = tiny_llama
  built: list[str] = []
  real = Llama.from_gguf
  def from_gguf(*args, **kwargs):
    built.append(kwargs["kv_dtype"])
    return real(*args, **kwargs)
  monkeypatch.setattr(Llama, "from_gguf", from_gguf)
  for flag in ([], ["--kv-cache", "float32"]):
    args = ["--model", str(path), "--prompt", " the", "--max-tokens", "2", "--progress", "never", *flag]
    assert cli.main(args, out=io.StringIO(), err=io.StringIO()) == 0
  assert built == ["float16", "float32"]
  with pytest.raises(SystemExit): cli.main(["--model", str(path), "--kv-cache", "int8"])
  assert "--kv-cache" in capsys.readouterr().err
