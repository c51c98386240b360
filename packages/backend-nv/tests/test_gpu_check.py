"""The prepared GPU check (packages/backend-nv/gpu_check.py) runs its own logic on MOCK+NV: the device report, an fp16
matmul under TinyJit checked against numpy, and the report files it writes for the README."""
from __future__ import annotations
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_check.py")

def test_gpu_check_runs_on_the_mock(tmp_path) -> None:
  proc = subprocess.run([sys.executable, SCRIPT, "--devices", "MOCK+NV", "--matmul", "48", "--only", "devices",
                         "matmul", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  results = json.loads((tmp_path / "gpu_report.json").read_text())
  assert [r["step"] for r in results] == ["devices", "matmul_MOCK_NV"] and all(r["rc"] == 0 for r in results)
  matmul = results[1]["matmul"]
  assert matmul["n"] == 48 and matmul["max_rel_err"] < 1e-3 and matmul["median_ms"] > 0
  report = (tmp_path / "gpu_report.md").read_text()
  assert "fp16 matmul 48 on MOCK_NV" in report and (tmp_path / "devices.log").read_text().strip()
