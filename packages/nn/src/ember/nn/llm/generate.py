"""Token generation: prefill the prompt in one pass, then one token per step; greedy or seeded sampling.

Sampling runs on the host over the last position's logits (one vocabulary-sized vector per step): temperature
scaling, then top-k, then top-p (the smallest set of most likely tokens whose probability reaches p).
"""
from __future__ import annotations
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence
import numpy as np
from ember.errors import EmberError

class SamplingError(EmberError, ValueError):
  """Sampling parameters out of range."""

class LanguageModel(Protocol):
  max_context: int
  @property
  def pos(self) -> int: ...
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray: ...

@dataclass(frozen=True)
class SamplingParams:
  """temperature 0 is greedy (argmax); top_k 0 and top_p 1.0 disable those filters."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int | None = None
  def __post_init__(self) -> None:
    if not (math.isfinite(self.temperature) and self.temperature >= 0):
      raise SamplingError(f"temperature must be a finite number >= 0, got {self.temperature}")
    if self.top_k < 0: raise SamplingError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0: raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.seed is not None and self.seed < 0: raise SamplingError(f"seed must be >= 0 or None, got {self.seed}")

def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
  """One token id from `logits` (vocab,) under `params`."""
  if params.temperature == 0.0: return int(np.argmax(logits))
  scaled = logits.astype(np.float64) / params.temperature
  order = np.argsort(-scaled, kind="stable")
  if params.top_k: order = order[:params.top_k]
  probs = np.exp(scaled[order] - scaled[order[0]])
  probs /= probs.sum()
  if params.top_p < 1.0:
    # keep tokens while the probability mass before them is below p (so the most likely token always stays)
    keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
    order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
  return int(order[rng.choice(len(order), p=probs)])

@dataclass
class GenerationStats:
  prompt_tokens: int = 0
  generated_tokens: int = 0
  prefill_s: float = 0.0
  decode_s: float = 0.0
  decode_step_s: list[float] = field(default_factory=list)
  @property
  def decode_tokens_per_s(self) -> float:
    steps = len(self.decode_step_s)
    return steps / sum(self.decode_step_s) if steps and sum(self.decode_step_s) > 0 else 0.0

def generate(model: LanguageModel, prompt_ids: Sequence[int], max_tokens: int, params: SamplingParams | None = None,
             stop_ids: frozenset[int] | set[int] = frozenset(), on_token: Callable[[int], bool | None] | None = None,
             stats: GenerationStats | None = None) -> list[int]:
  """Continue the model's context with `prompt_ids`, then produce up to `max_tokens` tokens.

  Generation stops after a token in `stop_ids` (which is included in the result) or when the KV cache is full.
  `on_token(id)` is called as each token arrives; when it returns True generation stops there (a caller's own stop
  condition, such as a stop string in the decoded text). The model's cache is not reset: call `model.reset()` first for
  an independent prompt, or keep it to continue a conversation.

  >>> generate(model, tok.encode("Once upon a time"), 20, stop_ids=tok.stop_ids)  # doctest: +SKIP
  """
  params = params or SamplingParams()
  if max_tokens < 0: raise SamplingError(f"max_tokens must be >= 0, got {max_tokens}")
  rng = np.random.default_rng(params.seed)
  stats = stats if stats is not None else GenerationStats()
  stats.prompt_tokens = len(prompt_ids)
  out: list[int] = []
  if max_tokens == 0: return out
  t0 = time.perf_counter()
  logits = model.forward(list(prompt_ids))
  stats.prefill_s = time.perf_counter() - t0
  while True:
    token = sample(logits, params, rng)
    out.append(token)
    stop = on_token(token) if on_token is not None else False
    if stop or token in stop_ids or len(out) >= max_tokens or model.pos >= model.max_context: break
    t = time.perf_counter()
    logits = model.forward([token])
    stats.decode_step_s.append(time.perf_counter() - t)
  stats.generated_tokens = len(out)
  stats.decode_s = sum(stats.decode_step_s)
  return out
