"""The weight-file readers under seeded mutation (loader_fuzz.py says how cases are made and judged): every case
raises the reader's typed error or loads what the reference reader loads. Marked `fuzz`: the `fuzz` nox session runs
it (EMBER_FUZZ_CASES cases, 3,000 by default, EMBER_FUZZ_SEED to vary them); `pytest -m fuzz` selects it."""
from __future__ import annotations
import os
import sys
from pathlib import Path
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # loader_fuzz, importable by the spawned workers too
import loader_fuzz  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

@pytest.mark.fuzz
def test_loaders_survive_mutated_files(capsys: pytest.CaptureFixture[str]):
  n, seed = int(os.environ.get("EMBER_FUZZ_CASES", "3000")), int(os.environ.get("EMBER_FUZZ_SEED", "0"))
  report = loader_fuzz.run_cases(loader_fuzz.make_cases(n, seed), workers=min(2, os.cpu_count() or 1))
  with capsys.disabled(): print("\n" + report.summary())  # the session's report: cases, typed errors, loads
  shown = "\n".join(f"{label}: {kind}: {detail}" for label, kind, detail in report.failures[:20])
  assert not report.failures, f"{report.summary()}\n{shown}"
  assert report.cases >= n and report.typed > 0 and report.loads > 0
