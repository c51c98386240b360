"""Settings for ember-nn's tests, applied before anything imports ember: backends load strictly and the IR spec
checker is on. When ember-nn is not installed, its source folder is put on sys.path so `ember.nn` resolves next to
ember-core (whose `ember/__init__.py` extends its `__path__`).

Tests marked `slow` (full training runs), `model` (real models from PyPI packages) or `fuzz` (seeded fuzzing, the `fuzz`
nox session) run only when selected: `pytest -m slow`, `pytest -m model`, `pytest -m fuzz`.
"""
from __future__ import annotations
import os
import sys
from pathlib import Path
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")

NN_SRC = Path(__file__).resolve().parents[1] / "src"
if not any(os.path.isdir(os.path.join(p or ".", "ember", "nn")) for p in sys.path): sys.path.insert(0, str(NN_SRC))

import pytest  # noqa: E402

# oracle values computed outside ember (transformers + torch, the datasets' published digests), kept with the tests
# so that every checkout runs the golden-model tests (a copy of the project's shared/data/golden)
GOLDEN = Path(__file__).resolve().parent / "golden"

def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "slow: a full training run (minutes); runs only with `-m slow`")
  config.addinivalue_line("markers", "model: loads a real model from its PyPI package; runs only with `-m model`")

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  selected = config.option.markexpr or ""
  for marker, how in (("slow", "slow test: select it with `pytest -m slow`"),
                      ("model", "real-model test: select it with `pytest -m model`"),
                      ("fuzz", "fuzz test: select it with `pytest -m fuzz` (the `fuzz` nox session)")):
    if marker in selected: continue
    for item in items:
      if marker in item.keywords: item.add_marker(pytest.mark.skip(reason=how))

@pytest.fixture
def training():
  """Training mode for the duration of a test."""
  from ember import Tensor
  prev, Tensor.training = Tensor.training, True
  yield
  Tensor.training = prev

@pytest.fixture
def golden() -> Path:
  """The folder of golden (oracle) files, tests/golden."""
  if not GOLDEN.is_dir(): pytest.skip(f"golden files are absent ({GOLDEN})")
  return GOLDEN
