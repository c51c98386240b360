"""`ember-llm --benchmark`: prefill time and decode speed of greedy generation, and the memory-bandwidth bound.

A decode step reads every weight once, so no implementation decodes faster than (memory bandwidth) / (bytes of
weights); the bandwidth is measured here as a large host memcpy (bytes read + bytes written per second), which is
what the CPU backend's buffers live in.
"""
from __future__ import annotations
import time
from dataclasses import dataclass
from typing import Callable, Sequence
import numpy as np
from ember.nn.llm.generate import GenerationStats, SamplingParams, generate
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
