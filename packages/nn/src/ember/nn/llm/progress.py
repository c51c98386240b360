"""Progress on stderr for ember-llm's slow starts: reading a GGUF's weights and building the layers, then the first
calls of the model's captured steps, which compile their kernels (tens of seconds on a small machine).

A tqdm bar when tqdm is installed (it comes with ember-nn[llm]), else a plain line on stderr; by default (`auto`)
only when stderr is a terminal, so logs and pipes stay clean unless `always` is asked for.
"""
from __future__ import annotations
import time
from typing import Any, Protocol, TextIO
import numpy as np
from ember.errors import EmberError
from ember.nn.llm.model import PREFILL_BUCKETS

PROGRESS_MODES = ("auto", "always", "never")

class ProgressError(EmberError, ValueError):
  """An unknown progress mode."""

class ProgressBar:
  """`bar(stage, done, total)` draws `stage: done/total`; a new stage closes the previous one's bar. `note(text)` says
  what the current step is doing."""
  def __init__(self, mode: str, file: TextIO):
    if mode not in PROGRESS_MODES: raise ProgressError(f"progress mode {mode!r} is not one of {PROGRESS_MODES}")
    self.file, self.enabled = file, mode == "always" or (mode == "auto" and file.isatty())
    self.stage: str | None = None
    self.tqdm: Any = None
    self.started = time.perf_counter()

  def __call__(self, stage: str, done: int, total: int) -> None:
    if not self.enabled: return
    if stage != self.stage: self._start(stage, total)
    if self.tqdm is not None: self.tqdm.update(done - self.tqdm.n)
    elif self.file.isatty(): self.file.write(f"\rember-llm: {stage}: {done}/{total}\x1b[K")
    if done >= total: self.close()

  def note(self, text: str) -> None:
    if not self.enabled or self.stage is None: return
    if self.tqdm is not None: self.tqdm.set_postfix_str(text)
    elif self.file.isatty(): self.file.write(f"\rember-llm: {self.stage}: {text}\x1b[K")
    else: self.file.write(f"ember-llm: {self.stage}: {text}\n")
    self.file.flush()

  def _start(self, stage: str, total: int) -> None:
    self.close()
    self.stage, self.started = stage, time.perf_counter()
    try: from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError: tqdm = None
    if tqdm is not None: self.tqdm = tqdm(total=total, desc=f"ember-llm: {stage}", file=self.file, leave=True)
    elif not self.file.isatty(): self.file.write(f"ember-llm: {stage} ({total})...\n")

  def close(self) -> None:
    """End the current stage's bar (a plain line says how long it took)."""
    if self.stage is None: return
    if self.tqdm is not None: self.tqdm.close()
    else:
      line = f"ember-llm: {self.stage}: done in {time.perf_counter() - self.started:.1f} s"
      self.file.write(f"\r{line}\x1b[K\n" if self.file.isatty() else f"{line}\n")
    self.file.flush()
    self.stage, self.tqdm = None, None

class Session(Protocol):
  max_context: int
  def reset(self) -> None: ...
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray: ...

def warm_up(session: Session, progress: ProgressBar, token: int = 0) -> None:
  """Call each prefill step that fits the context, and the decode step, twice on `session` (a scratch KV cache or a
  request slot, left reset): the first call compiles a step's kernels, the second captures them, so the first request
  then runs at full speed. `token` fills the prompts (any id: only the kernels matter)."""
  sizes = [size for size in PREFILL_BUCKETS if size + 2 <= session.max_context]
  total = 2 * len(sizes)
  progress("compiling the model's steps", 0, total)
  for k, size in enumerate(sizes):
    for run, what in enumerate(("compile", "capture")):
      progress.note(f"{what} the prefill of {size} tokens" + (" and the decode step" if k == 0 and run == 0 else ""))
      session.reset()
      session.forward([token] * size)
      if k == 0 and run == 0:  # the decode step, compiled and captured alongside the first prefill
        session.forward([token])
        session.forward([token])
      progress("compiling the model's steps", 2 * k + run + 1, total)
  session.reset()
