"""tools/compat_report.py: every tinygrad Tensor name ember lacks has a reason, and docs/tinygrad-compat.md holds the
current list."""
from __future__ import annotations
import importlib.util
import io
import pathlib
from contextlib import redirect_stdout
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "compat_report.py"
pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="run from the monorepo checkout (tools/ is not packaged)")

def _load():
  spec = importlib.util.spec_from_file_location("compat_report", SCRIPT)
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod

def test_every_missing_name_has_a_reason_and_the_issue_names_exist():
  mod = _load()
  names = mod.NAMES_FILE.read_text().split()
  assert len(names) == 251
  lacking = mod.missing(names)
  assert lacking and all(n in mod.REASONS for n in lacking), [n for n in lacking if n not in mod.REASONS]
  wanted = ("sequential layernorm batchnorm linear allclose eq ne is_floating_point bfloat16 short rand_like "
            "randn_like randperm multinomial random_bits rearrange pad_to shrink_to svd qr newton_schulz keccak hash "
            "from_blob size to_ shard_like").split()
  assert not set(wanted) & set(lacking)

def test_docs_hold_the_current_table():
  mod = _load()
  out = io.StringIO()
  with redirect_stdout(out): mod.main(["--markdown"])
  doc = (ROOT / "docs" / "tinygrad-compat.md").read_text()
  assert out.getvalue().strip() in doc
  assert "-from tinygrad import Tensor" in doc and "+from ember import Tensor" in doc
