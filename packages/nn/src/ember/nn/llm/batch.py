"""Continuous batching: concurrent sequences decode together, one batched forward per step.

`BatchEngine(model, slots)` owns a KV cache of `slots` slots and one thread that runs the model. Each slot has a
`BatchSession`, which has the interface `generate` drives (forward, pos, max_context, reset), so a request thread
runs the ordinary `generate(session, ...)`: its `forward` hands the tokens to the engine and waits for the logits.
Per step the engine takes every forward handed in: prompts (several tokens, or a slot's first) are prefilled one by
one into their slots, and all single-token forwards run as one `Llama.decode_batch` over the whole cache. A request
joins by handing in its prompt and leaves by no longer handing in tokens, both between steps.

The engine waits for a step's batch to fill: until every slot of the previous decode batch has handed in its next
token, or `gather_s` after the first forward arrived (a slot whose request ended is dropped from the wait then).

Every slot is computed in every decode step (idle ones masked), and a row's result does not depend on the others, so
a request's greedy reply is the same whether it decodes alone or next to others.

>>> engine = BatchEngine(model, slots=4)  # doctest: +SKIP
>>> generate(engine.sessions[0], prompt_ids, 32)  # doctest: +SKIP  (from several threads at once)
"""
from __future__ import annotations
import threading
import time
from dataclasses import dataclass, field
import numpy as np
from ember.errors import EmberError
from ember.nn.llm.model import Llama, ModelError

GATHER_S = 0.002  # how long a step waits for the slots of the previous batch to hand in their next token

class EngineClosedError(EmberError, RuntimeError):
  """A forward was handed to a BatchEngine that was closed."""

@dataclass
class _Work:
  slot: int
  tokens: np.ndarray
  done: threading.Event = field(default_factory=threading.Event)
  logits: np.ndarray | None = None
  error: BaseException | None = None

class BatchSession:
  """One slot of a BatchEngine, as `generate` drives a model: forward blocks until the engine's step ran it."""
  def __init__(self, engine: BatchEngine, slot: int):
    self.engine, self.slot, self.max_context = engine, slot, engine.model.max_context
  @property
  def pos(self) -> int: return self.engine.cache.pos[self.slot]
  def reset(self) -> None: self.engine.cache.pos[self.slot] = 0
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
    return self.engine.submit(self.slot, np.asarray(tokens, np.int64).reshape(-1))

class BatchEngine:
  """The model, a KV cache of `slots` slots and the thread that steps them; `sessions[i]` drives slot i. A slot is
  used by one request at a time (the caller hands sessions out, as the HTTP server's slot queue does)."""
  def __init__(self, model: Llama, slots: int, gather_s: float = GATHER_S):
    if slots < 1: raise ModelError(f"a batch engine needs at least one slot, got {slots}")
    self.model, self.cache, self.gather_s = model, model.new_cache(slots), gather_s
    self.sessions = [BatchSession(self, i) for i in range(slots)]
    self.steps = 0  # decode steps run, for tests and the benchmark: batched tokens = decode tokens / steps
    self._pending: dict[int, _Work] = {}
    self._last_batch: set[int] = set()
    self._closed = False
    self._wake = threading.Condition()
    self._thread = threading.Thread(target=self._loop, name="ember-llm-batch", daemon=True)
    self._thread.start()

  def submit(self, slot: int, tokens: np.ndarray) -> np.ndarray:
    """Run `tokens` in `slot` in the next step; returns the last position's logits (vocab,)."""
    work = _Work(slot, tokens)
    with self._wake:
      if self._closed: raise EngineClosedError("the batch engine was closed; create a new one")
      if slot in self._pending: raise ModelError(f"slot {slot} already has a forward waiting; one request per slot")
      self._pending[slot] = work
      self._wake.notify_all()
    work.done.wait()
    if work.error is not None: raise work.error
    assert work.logits is not None
    return work.logits

  def close(self) -> None:
    """Stop the engine thread; forwards waiting or handed in later raise EngineClosedError."""
    with self._wake:
      self._closed = True
      self._wake.notify_all()
    self._thread.join()

  def _gather(self) -> list[_Work] | None:
    """The forwards of the next step, or None when closed."""
    with self._wake:
      while not self._pending and not self._closed: self._wake.wait()
      deadline = time.monotonic() + self.gather_s
      while not self._closed and not self._last_batch <= set(self._pending):
        if (left := deadline - time.monotonic()) <= 0: break
        self._wake.wait(left)
      if self._closed:
        for work in self._pending.values(): work.error = EngineClosedError("the batch engine was closed")
        for work in self._pending.values(): work.done.set()
        return None
      batch, self._pending = list(self._pending.values()), {}
      return batch

  def _loop(self) -> None:
    while (batch := self._gather()) is not None:
      # a slot's forward that cannot join the decode step (a prompt, a first token, a full context) runs alone,
      # so that its error reaches only its own request
      ctx = self.model.max_context
      decode = [w for w in batch if w.tokens.size == 1 and 0 < self.cache.pos[w.slot] < ctx]
      batched = {id(w) for w in decode}
      for work in batch:
        if id(work) in batched: continue
        try: work.logits = self.model.forward(work.tokens, self.cache, work.slot)
        except Exception as e: work.error = e  # noqa: BLE001 (re-raised in the request's thread)
        work.done.set()
      self._last_batch = {w.slot for w in decode}
      if decode: self._decode(decode)

  def _decode(self, decode: list[_Work]) -> None:
    try:
      logits = self.model.decode_batch([int(w.tokens[0]) for w in decode], [w.slot for w in decode], self.cache)
      for work, row in zip(decode, logits): work.logits = row
    except Exception as e:  # noqa: BLE001 (re-raised in every waiting request's thread)
      for work in decode: work.error = e
    self.steps += 1
    for work in decode: work.done.set()
