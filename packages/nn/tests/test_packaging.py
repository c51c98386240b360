"""ember-nn ships `ember/nn/` without `ember/__init__.py`: installed next to ember-core from wheels (not editable),
`from ember import nn` and `from ember.nn.optim import Adam` must resolve through core's pkgutil-style `__path__`."""
from __future__ import annotations
import subprocess
import sys
import zipfile
from pathlib import Path
import pytest

PACKAGES = Path(__file__).resolve().parents[2]

@pytest.mark.slow
def test_installed_wheels_import(tmp_path: Path):
  pytest.importorskip("hatchling")
  wheels, target = tmp_path / "wheels", tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                  str(PACKAGES / "core"), str(PACKAGES / "nn")], check=True, capture_output=True, timeout=300)
  nn_wheel = next(wheels.glob("ember_nn-*.whl"))
  names = zipfile.ZipFile(nn_wheel).namelist()
  assert "ember/nn/__init__.py" in names and "ember/nn/py.typed" in names and "ember/__init__.py" not in names
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target),
                  *map(str, wheels.glob("*.whl"))], check=True, capture_output=True, timeout=300)
  code = ("import ember; from ember import nn; from ember.nn.optim import Adam, AdamW; "
          "from ember.nn.state import safe_load; print(nn.__file__); print(Adam.__module__)")
  res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
  assert res.returncode == 0, res.stderr
  nn_file, adam_module = res.stdout.split()
  assert nn_file.startswith(str(target)) and adam_module == "ember.nn.optim"
