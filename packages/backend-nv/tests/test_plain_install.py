"""`pip install ember-core ember-backend-nv` without extras (so without the NVRTC wheel) into a fresh venv gives a
working MOCK+NV: the doctor reports its interface usable as opened, and the conformance kit passes on it."""
from __future__ import annotations
import json
import os
import subprocess
import sys
import pytest

PACKAGES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def _run(cmd: list[str], cwd: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
  return proc

@pytest.mark.plain_install
def test_mock_nv_from_a_plain_install(tmp_path) -> None:
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  python = str(venv / "bin" / "python")
  # a clean environment: nothing of this checkout or of the outer interpreter's packages leaks in
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EMBER_PLUGINS", "DEV", "VIRTUAL_ENV")}
  _run([python, "-m", "pip", "install", "--quiet", os.path.join(PACKAGES, "core"), os.path.join(PACKAGES, "backend-nv"),
        "pytest", "numpy"], str(tmp_path), env, 900)
  code = "import importlib.util; print(importlib.util.find_spec('nvidia'))"
  assert _run([python, "-c", code], str(tmp_path), env, 60).stdout.strip() == "None"  # no NVRTC wheel came along
  report = json.loads(_run([python, "-m", "ember", "devices", "--json"], str(tmp_path), env, 300).stdout)
  nv = next(b for b in report["backends"] if b["name"] == "nv")
  mock = next(i for d in nv["devices"] if d["name"] == "NV" for i in d["interface_probes"] if i["name"] == "MOCK")
  assert mock["ok"] and "compiler NVShimCompiler" in mock["reason"], mock
  kit = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "ember.testing",
              "--ember-device=MOCK+NV"], str(tmp_path), {**env, "DEV": "MOCK+NV", "EMBER_STRICT_BACKENDS": "1"}, 900)
  assert " passed" in kit.stdout and "failed" not in kit.stdout, kit.stdout[-2000:]
