"""The conformance kit itself: it imports nothing beyond numpy/pytest, loads through its ``pytest11`` entry point, and
passes on core's PYTHON and NULL devices (skipping, never failing, the tiers they do not declare)."""
from __future__ import annotations
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
import pytest

CORE = Path(__file__).resolve().parents[2]
SRC = CORE / "src"

def _env(extra_path: str = "") -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_") and k not in ("DEV", "PYTEST_ADDOPTS")}
  env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(SRC)) if p)
  return env

def _plugin_args() -> list[str]:
  """`-p ember.testing.plugin` from a source checkout; nothing where an installed ember-core's entry point loads it."""
  import importlib.metadata as md
  installed = any(ep.value == "ember.testing.plugin" for ep in md.entry_points(group="pytest11"))
  return [] if installed else ["-p", "ember.testing.plugin"]

def _run_kit(*args: str, extra_path: str = "") -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
  cmd = [sys.executable, "-m", "pytest", "--pyargs", "ember.testing", "-q", "-rs", "-p", "no:cacheprovider", *args]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(extra_path), timeout=600, cwd=str(CORE))
  counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", proc.stdout)}
  return proc, counts

def test_importing_the_kit_pulls_in_no_test_only_dependencies():
  code = ("import sys; import ember.testing; import ember.testing.plugin; "
          "print(sorted({m.split('.')[0] for m in sys.modules}))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
  assert out.returncode == 0, out.stderr
  loaded = set(eval(out.stdout))  # noqa: S307  our own subprocess prints a list literal
  for forbidden in ("torch", "hypothesis", "pytest_benchmark", "tinygrad", "jax", "ember_cpu"):
    assert forbidden not in loaded

def test_pytest11_entry_point_loads_the_plugin(tmp_path: Path):
  # a dist-info declaring exactly the pytest11 entry point of ember-core's pyproject.toml, without pip
  project = tomllib.loads((CORE / "pyproject.toml").read_text())["project"]
  entry = project["entry-points"]["pytest11"]
  assert entry == {"ember": "ember.testing.plugin"}
  info = tmp_path / "ember_core-0.0.0.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-core\nVersion: 0.0.0\n")
  (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
  proc, counts = _run_kit("--ember-device=NULL", "-k", "registration", extra_path=str(tmp_path))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert counts.get("passed", 0) >= 4 and "failed" not in counts

@pytest.mark.parametrize("device,skipped_tiers", [
  ("NULL", ("holds no data",)),
  ("PYTHON", ("registers no HCQ queue interfaces", "does not split kernels over threads", "is the reference device")),
])
def test_kit_passes_on_core_devices(device, skipped_tiers):
  proc, counts = _run_kit(f"--ember-device={device}", *_plugin_args())
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert counts.get("passed", 0) >= 20 and "failed" not in counts
  for reason in skipped_tiers: assert reason in proc.stdout  # a missing capability is a skip with its reason

def test_an_unknown_device_fails_with_the_reason():
  proc, counts = _run_kit("--ember-device=NOSUCHDEV", *_plugin_args(), "-k", "registration")
  assert proc.returncode != 0
  assert "NOSUCHDEV" in proc.stdout
