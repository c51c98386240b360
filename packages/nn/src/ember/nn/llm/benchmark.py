"""`ember-llm --benchmark`: prefill time and decode speed of greedy generation, and the memory-bandwidth bound;
with `--concurrency N`, the total decode speed of N clients served by the batch engine against one client's.

A decode step reads every weight once, so no implementation decodes faster than (memory bandwidth) / (bytes of
weights); the bandwidth is measured here as a large host memcpy (bytes read + bytes written per second), which is
what the CPU backend's buffers live in.
"""
from __future__ import annotations
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence
import numpy as np
from ember.nn.llm.generate import GenerationStats, SamplingParams, generate
from ember.nn.llm.batch import BatchEngine
from ember.nn.llm.model import Llama, ModelError

@dataclass(frozen=True)
class BenchmarkResult:
  prompt_tokens: int
  decode_tokens: int
  runs: int
  prefill_ms: float  # median over the runs
  decode_tokens_per_s: float  # median over the runs of (decode steps / their total time)
  weight_bytes: int
  bandwidth_bytes_per_s: float
  @property
  def bound_tokens_per_s(self) -> float: return self.bandwidth_bytes_per_s / self.weight_bytes

  def lines(self) -> list[str]:
    return [f"prefill: {self.prompt_tokens} tokens in {self.prefill_ms:.1f} ms (median of {self.runs})",
            f"decode: {self.decode_tokens_per_s:.2f} tokens/s for {self.decode_tokens} greedy tokens (median of "
            f"{self.runs})",
            f"bandwidth bound: {self.weight_bytes / 1e6:.1f} MB of weights per token at "
            f"{self.bandwidth_bytes_per_s / 1e9:.1f} GB/s memcpy = {self.bound_tokens_per_s:.0f} tokens/s "
            f"(decode reaches {100 * self.decode_tokens_per_s / self.bound_tokens_per_s:.1f}% of it)"]

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

def run_benchmark(model: Llama, prompt_ids: Sequence[int], decode_tokens: int = 128, runs: int = 3,
                  on_run: Callable[[GenerationStats], None] | None = None) -> BenchmarkResult:
  """Greedy generation of `decode_tokens` tokens after `prompt_ids`, `runs` times after two short warm-up runs (which
  compile the kernels and capture the steps); stop tokens do not end a run."""
  if runs < 1 or decode_tokens < 2: raise ModelError(f"the benchmark needs runs >= 1 and decode_tokens >= 2, got "
                                                     f"{runs} and {decode_tokens}")
  if len(prompt_ids) + decode_tokens > model.max_context:
    raise ModelError(f"{len(prompt_ids)} prompt + {decode_tokens} generated tokens exceed max_context "
                     f"{model.max_context}; raise --max-context")
  for _ in range(2):  # the 1st call of each step runs it normally, the 2nd captures it: both are warm-up
    model.reset()
    generate(model, prompt_ids, 3, SamplingParams(), frozenset())
  prefill, decode = [], []
  for _ in range(runs):
    model.reset()
    stats = GenerationStats()
    generate(model, prompt_ids, decode_tokens, SamplingParams(), frozenset(), stats=stats)
    prefill.append(stats.prefill_s * 1000)
    decode.append(stats.decode_tokens_per_s)
    if on_run is not None: on_run(stats)
  return BenchmarkResult(len(prompt_ids), decode_tokens, runs, float(np.median(prefill)), float(np.median(decode)),
                         model.weight_bytes, memcpy_bandwidth())

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
