"""`ember-llm --benchmark`: prefill time and decode speed of greedy generation at several context lengths, the bytes
a decode step reads and the rate it reads them at, and the memory-bandwidth bound; with `--concurrency N`, the total
decode speed of N clients served by the batch engine against one client's.

A decode step reads every weight once, and the cached keys and values of every position before it, so no
implementation decodes faster than (memory bandwidth) / (those bytes); the bandwidth is measured here as a large host
memcpy (bytes read + bytes written per second), which is what the CPU backend's buffers live in.
"""
from __future__ import annotations
import threading
import time
from dataclasses import dataclass
from typing import Sequence
import numpy as np
from ember.nn.llm.generate import GenerationStats, SamplingParams, generate
from ember.nn.llm.batch import BatchEngine
from ember.nn.llm.model import PREFILL_BUCKETS, Llama, ModelError, prefill_chunks

CONTEXTS = (128, 512, 2048)  # prompt lengths `ember-llm --benchmark` prefills and then decodes after

@dataclass(frozen=True)
class ContextResult:
  """Prefill of a `context`-token prompt, then greedy decoding of `decode_tokens` tokens after it (medians of
  `runs`)."""
  context: int
  decode_tokens: int
  runs: int
  prefill_ms: float
  decode_tokens_per_s: float
  bytes_per_token: int  # weights plus the cached keys/values a decode step reads, at the decoded tokens' mean position
  @property
  def prefill_tokens_per_s(self) -> float: return self.context / (self.prefill_ms / 1000)
  @property
  def decode_bytes_per_s(self) -> float: return self.bytes_per_token * self.decode_tokens_per_s

  def line(self) -> str:
    return (f"context {self.context}: prefill {self.prefill_ms:.1f} ms ({self.prefill_tokens_per_s:.0f} tokens/s), "
            f"decode {self.decode_tokens_per_s:.2f} tokens/s reading {self.bytes_per_token / 1e6:.1f} MB per token "
            f"= {self.decode_bytes_per_s / 1e9:.2f} GB/s")

def context_prompt(prompt_ids: Sequence[int], length: int) -> list[int]:
  """`prompt_ids` repeated to `length` tokens: the text a context-length benchmark prefills."""
  if not prompt_ids: raise ModelError("the benchmark needs a prompt of at least one token")
  return [int(t) for t in np.resize(np.asarray(prompt_ids, np.int64), length)]

def run_context_benchmark(model: Llama, prompt_ids: Sequence[int], contexts: Sequence[int] = CONTEXTS,
                          decode_tokens: int = 128, runs: int = 3) -> list[ContextResult]:
  """For each length in `contexts`: prefill `prompt_ids` repeated to that length, then greedy-decode `decode_tokens`
  tokens, `runs` times (stop tokens do not end a run). Every captured step is warmed up first (each prefill chunk size
  the lengths use, and the decode step), so no run compiles or captures."""
  if runs < 1 or decode_tokens < 2 or not contexts or min(contexts) < 1:
    raise ModelError(f"the context benchmark needs runs >= 1, decode_tokens >= 2 and context lengths >= 1, got "
                     f"{runs}, {decode_tokens} and {list(contexts)}")
  if max(contexts) + decode_tokens > model.max_context:
    raise ModelError(f"context {max(contexts)} + {decode_tokens} generated tokens exceed max_context "
                     f"{model.max_context}; raise --max-context (the model's own limit is "
                     f"{model.cfg.context_length})")
  big = PREFILL_BUCKETS[-1]
  # a prompt of each chunk length the contexts are prefilled in (a full chunk, the rest) warms up its chunk size
  chunk_lengths = {min(n, big) for n in contexts} | {n - big * (len(prefill_chunks(n)) - 1) for n in contexts}
  for length in sorted(chunk_lengths):
    for _ in range(2):  # the 1st call of a step runs it normally, the 2nd captures it
      model.reset()
      generate(model, context_prompt(prompt_ids, length), 3, SamplingParams(), frozenset())
  results = []
  for n in contexts:
    ids = context_prompt(prompt_ids, n)
    prefill, decode = [], []
    for _ in range(runs):
      model.reset()
      stats = GenerationStats()
      generate(model, ids, decode_tokens, SamplingParams(), frozenset(), stats=stats)
      prefill.append(stats.prefill_s * 1000)
      decode.append(stats.decode_tokens_per_s)
    mean_position = n + (decode_tokens - 2) / 2  # decode steps run at positions n .. n + decode_tokens - 2
    results.append(ContextResult(n, decode_tokens, runs, float(np.median(prefill)), float(np.median(decode)),
                                 model.decode_bytes(round(mean_position))))
  return results

def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
  """Bytes moved per second (read + write) by a host copy of `nbytes`, the median of `repeats` copies."""
  src = np.ones(nbytes, np.uint8)
  dst = np.empty_like(src)
  np.copyto(dst, src)  # touch the pages first
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - t)
  return 2 * nbytes / float(np.median(times))

@dataclass(frozen=True)
class ConcurrencyResult:
  clients: int
  decode_tokens: int  # per client
  single_tokens_per_s: float  # one client's decode tokens per second of decoding, through the engine
  total_tokens_per_s: float  # all clients' decode tokens per second of wall time while they decode together
  steps: int  # decode steps the concurrent run took (clients * decode tokens when nothing was batched)
  replies_match: bool  # every concurrent greedy reply equals the single-client reply
  @property
  def speedup(self) -> float: return self.total_tokens_per_s / self.single_tokens_per_s

  def lines(self) -> list[str]:
    return [f"1 client: {self.single_tokens_per_s:.2f} decode tokens/s",
            f"{self.clients} clients: {self.total_tokens_per_s:.2f} decode tokens/s in total ({self.speedup:.2f}x one "
            f"client; {self.clients * (self.decode_tokens - 1)} tokens in {self.steps} batched steps)",
            f"greedy replies {'equal' if self.replies_match else 'DIFFER FROM'} the single-client reply"]

def _clients(engine: BatchEngine, prompt_ids: Sequence[int], decode_tokens: int, clients: int
             ) -> tuple[list[list[int]], float, int]:
  """`clients` threads generating greedily at once: (replies, decode tokens per second of wall time, steps)."""
  replies: list[list[int]] = [[] for _ in range(clients)]
  windows: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * clients
  steps = engine.steps
  def client(i: int) -> None:
    stats = GenerationStats()
    session = engine.sessions[i]
    session.reset()
    start = time.perf_counter()
    replies[i] = generate(session, prompt_ids, decode_tokens, SamplingParams(), frozenset(), stats=stats)
    windows[i] = (start + stats.prefill_s, time.perf_counter(), len(stats.decode_step_s))
  threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
  for t in threads: t.start()
  for t in threads: t.join()
  wall = max(w[1] for w in windows) - min(w[0] for w in windows)
  return replies, sum(w[2] for w in windows) / wall, engine.steps - steps

def run_concurrency_benchmark(model: Llama, prompt_ids: Sequence[int], decode_tokens: int = 128,
                              clients: int = 4) -> ConcurrencyResult:
  """Greedy decoding of `decode_tokens` tokens by one client, then by `clients` clients at once, all through one
  BatchEngine of `clients` slots (after a warm-up that captures its steps)."""
  if clients < 1 or decode_tokens < 2: raise ModelError(f"the concurrency benchmark needs clients >= 1 and "
                                                        f"decode_tokens >= 2, got {clients} and {decode_tokens}")
  if len(prompt_ids) + decode_tokens > model.max_context:
    raise ModelError(f"{len(prompt_ids)} prompt + {decode_tokens} generated tokens exceed max_context "
                     f"{model.max_context}; raise --max-context")
  engine = BatchEngine(model, clients)
  try:
    for _ in range(2): _clients(engine, prompt_ids, 3, clients)  # run, then capture the steps
    (single,), single_rate, _ = _clients(engine, prompt_ids, decode_tokens, 1)
    replies, total_rate, steps = _clients(engine, prompt_ids, decode_tokens, clients)
  finally: engine.close()
  return ConcurrencyResult(clients, decode_tokens, single_rate, total_rate, steps, all(r == single for r in replies))
