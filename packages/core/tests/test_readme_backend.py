"""The README's worked third-party backend is real: its code blocks are built into a distribution and run."""
from __future__ import annotations
import re
import shutil
from pathlib import Path
import pytest

README = Path(__file__).resolve().parents[3] / "README.md"

def _blocks() -> dict[str, str]:
  """The README's python code blocks whose first line names a file, e.g. `# src/ember_toy/plugin.py`."""
  out = {}
  for body in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
    first = body.splitlines()[0]
    if first.startswith("# src/"): out[first[2:].strip()] = body
  return out

@pytest.mark.skipif(not README.exists(), reason="README.md is not beside this checkout (installed package tests)")
@pytest.mark.skipif(shutil.which("cc") is None, reason="the example backend needs a C compiler named cc")
def test_readme_toy_backend_runs(fake_site) -> None:
  blocks = _blocks()
  assert set(blocks) == {"src/ember_toy/plugin.py", "src/ember_toy/device.py"}
  pkg = fake_site.root / "ember_toy"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  for path, body in blocks.items(): (fake_site.root / path[len("src/"):]).write_text(body)
  info = fake_site.root / "ember_backend_toy-0.1.0.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-backend-toy\nVersion: 0.1.0\n")
  (info / "entry_points.txt").write_text("[ember.backends]\ntoy = ember_toy.plugin\n")
  code = ("import numpy as np\nfrom ember import Tensor\n"
          "x = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
          "t = Tensor(x)\n"
          "np.testing.assert_allclose(((t * 3).relu() + 1).numpy(), np.maximum(x * 3, 0) + 1)\n"
          "np.testing.assert_allclose((t @ t.T).numpy(), x @ x.T)\n"
          "np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1))\n"
          "print('ok', t.device)\n")
  proc = fake_site.run(code, DEV="TOY")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "ok TOY"
  doctor = fake_site.run("", "-m", "ember", "devices", "--json")
  assert '"toy"' in doctor.stdout and "TOY" in doctor.stdout, doctor.stdout + doctor.stderr
