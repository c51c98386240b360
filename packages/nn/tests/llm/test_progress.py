"""ember-llm's progress reporting: the loader tells every tensor read and layer built, the bar is quiet off a terminal
unless asked, draws tqdm when it is installed and plain lines without it, and the warm-up compiles and captures every
step that fits the context, leaving the cache empty and the model's replies unchanged."""
from __future__ import annotations
import builtins
import io
import numpy as np
import pytest
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import PREFILL_BUCKETS, Llama
from ember.nn.llm.progress import ProgressBar, ProgressError, warm_up

class Terminal(io.StringIO):
  def isatty(self) -> bool: return True

def test_loading_reports_every_tensor_and_layer(tiny_llama):
  path, _, cfg = tiny_llama
  calls: list[tuple[str, int, int]] = []
  Llama.from_gguf(path, max_context=16, progress=lambda *call: calls.append(call))
  n_tensors = len(GGUFFile(path).tensors)
  assert calls == [("reading tensors", i, n_tensors) for i in range(1, n_tensors + 1)] + \
    [("building layers", i, cfg["n_layers"]) for i in range(1, cfg["n_layers"] + 1)]

def test_progress_is_quiet_off_a_terminal_unless_asked():
  for mode, stream, shown in (("auto", io.StringIO(), False), ("auto", Terminal(), True),
                              ("always", io.StringIO(), True), ("never", Terminal(), False)):
    bar = ProgressBar(mode, stream)
    for i in range(1, 4): bar("reading tensors", i, 3)
    assert bool(stream.getvalue()) == shown, mode
  with pytest.raises(ProgressError, match="'sometimes' is not one of"): ProgressBar("sometimes", io.StringIO())

def test_plain_lines_without_tqdm(monkeypatch):
  real_import = builtins.__import__
  def no_tqdm(name, *args, **kwargs):
    if name == "tqdm": raise ImportError("no tqdm here")
    return real_import(name, *args, **kwargs)
  monkeypatch.setattr(builtins, "__import__", no_tqdm)
  log = io.StringIO()
  bar = ProgressBar("always", log)
  for i in range(1, 5): bar("reading tensors", i, 4)
  bar("compiling the model's steps", 0, 2)
  bar.note("compile the prefill of 8 tokens")
  bar("compiling the model's steps", 2, 2)
  lines = log.getvalue().splitlines()
  assert lines[0] == "ember-llm: reading tensors (4)..." and lines[1].startswith("ember-llm: reading tensors: done in")
  assert lines[2:4] == ["ember-llm: compiling the model's steps (2)...",
                        "ember-llm: compiling the model's steps: compile the prefill of 8 tokens"]
  assert lines[4].startswith("ember-llm: compiling the model's steps: done in") and len(lines) == 5

def test_tqdm_bar_when_installed():
  pytest.importorskip("tqdm", reason="tqdm comes with ember-nn[llm]")
  log = io.StringIO()
  bar = ProgressBar("always", log)
  for i in range(1, 6): bar("building layers", i, 5)
  assert "ember-llm: building layers" in log.getvalue() and "5/5" in log.getvalue()

class Recorder:
  """A session that records the token counts of its forwards and its resets."""
  def __init__(self, max_context: int):
    self.max_context, self.calls = max_context, []
  def reset(self) -> None: self.calls.append("reset")
  def forward(self, tokens):
    self.calls.append(len(tokens))
    return np.zeros(4, np.float32)

@pytest.mark.parametrize("max_context", [64, 20, 4])
def test_warm_up_runs_each_step_that_fits_twice(max_context):
  session = Recorder(max_context)
  warm_up(session, ProgressBar("never", io.StringIO()))
  sizes = [size for size in PREFILL_BUCKETS if size + 2 <= max_context]
  expected: list[object] = []
  for k, size in enumerate(sizes):
    expected += ["reset", size, 1, 1, "reset", size] if k == 0 else ["reset", size, "reset", size]
  assert session.calls == expected + ["reset"]

def test_warm_up_leaves_replies_unchanged(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=48)
  warm_up(model, ProgressBar("never", io.StringIO()))
  assert model.pos == 0
  ids = [5, 77, 200, 3]
  np.testing.assert_allclose(model.forward(ids), reference_logits(hf, cfg, ids)[-1], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(model.forward([9]), reference_logits(hf, cfg, ids + [9])[-1], rtol=1e-4, atol=1e-4)
