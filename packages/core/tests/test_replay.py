"""Process replay (ember.replay): two captures of the same code compare equal; a changed renderer rule, a changed
kernel and a workload that raises are each reported with a non-zero exit; the driver run against a checkout in a
child process (`--tree`) records the same kernels and programs as in-process."""
from __future__ import annotations
import io
import json
import os
from pathlib import Path
import pytest
from ember.device.python import PythonRenderer
from ember.replay import CaptureNotFoundError, ReplayError, WORKLOADS, capture, capture_tree, compare
from ember.replay.__main__ import main
from ember.replay.corpus import Workload
from ember.uop.ops import Ops

SMALL = ["api/matmul", "api/trig"]  # four kernels; sin appears in the trig kernel only

def _compare(a: Path, b: Path) -> tuple[int, str]:
  out = io.StringIO()
  return compare(str(a), str(b), out), out.getvalue()

def _keys_with(capture_dir: Path, op: str) -> set[str]:
  """The kernels whose AST (as captured) holds `op`."""
  return {p.stem for p in (capture_dir / "ast").iterdir() if f" {op} " in p.read_text()}

def test_two_captures_of_the_same_code_are_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
  first = capture(str(tmp_path / "a"), SMALL)
  capture(str(tmp_path / "b"), SMALL)
  assert len(first["kernels"]) >= 4 and "PYTHON:PYTHON" in first["renderers"]
  assert all(w["error"] is None for w in first["workloads"].values())
  assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
  assert "0 differences" in capsys.readouterr().out
  assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "b"))

def test_a_changed_renderer_rule_is_reported_for_the_kernels_it_changes(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
  capture(str(tmp_path / "before"), SMALL)
  monkeypatch.setitem(PythonRenderer.code_for_op, Ops.SIN, lambda x: f"sine({x})")
  manifest = capture(str(tmp_path / "after"), SMALL)
  sin_kernels = _keys_with(tmp_path / "after", "Ops.SIN")
  assert len(sin_kernels) == 1 and len(manifest["kernels"]) > 1
  (key,) = sin_kernels
  assert main(["compare", str(tmp_path / "before"), str(tmp_path / "after")]) == 1
  out = capsys.readouterr().out
  changed = [line for line in out.splitlines() if line.startswith("changed ")]
  assert changed == [f"changed PYTHON:PYTHON: {manifest['kernels'][key]['name']} [{key}] (first in api/trig)"]
  assert any(line.startswith("-") and "sin(" in line for line in out.splitlines())
  assert any(line.startswith("+") and "sine(" in line for line in out.splitlines())

def test_a_kernel_whose_ast_changed_is_removed_added_and_diffed(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
  from ember import Tensor
  capture(str(tmp_path / "before"), ["api/matmul"])
  def e(*shape: int) -> Tensor: return Tensor.empty(*shape)
  def other_matmul() -> None: Tensor.realize(e(5, 7) @ e(7, 4), e(2, 3, 4) @ e(2, 4, 5), e(33, 65) @ e(65, 17))  # 1st
  monkeypatch.setitem(WORKLOADS, "api/matmul", Workload(other_matmul, "PYTHON"))
  capture(str(tmp_path / "after"), ["api/matmul"])
  count, out = _compare(tmp_path / "before", tmp_path / "after")
  assert count > 0
  assert "workload api/matmul: 1 of its 3 kernels in " in out and "1 of its 3 kernels there are new" in out
  assert len([line for line in out.splitlines() if line.startswith(("removed: ", "added: "))]) == 2
  assert "--- the AST of " in out and "+++ " in out

def test_a_workload_that_raises_is_recorded_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  capture(str(tmp_path / "before"), ["api/trig"])
  def broken() -> None: raise ValueError("bad shapes")
  monkeypatch.setitem(WORKLOADS, "api/trig", Workload(broken, "PYTHON"))
  manifest = capture(str(tmp_path / "after"), ["api/trig"])
  assert manifest["workloads"]["api/trig"] == {"device": "PYTHON", "kernels": [], "error": "ValueError: bad shapes"}
  count, out = _compare(tmp_path / "before", tmp_path / "after")
  assert count > 0 and "workload api/trig error: None vs ValueError: bad shapes" in out

def test_bad_arguments_raise_typed_errors(tmp_path: Path) -> None:
  with pytest.raises(CaptureNotFoundError, match="no manifest.json") as e:
    compare(str(tmp_path), str(tmp_path), io.StringIO())
  assert isinstance(e.value, FileNotFoundError)
  with pytest.raises(SystemExit) as exit_info: main(["compare", str(tmp_path), str(tmp_path)])  # the CLI: usage error
  assert exit_info.value.code == 2
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(ReplayError, match="is not empty and holds no manifest.json") as e2: capture(str(tmp_path), SMALL)
  assert isinstance(e2.value, ValueError) and (tmp_path / "notes.txt").exists()
  with pytest.raises(ReplayError, match="no workload matches nope/"): capture(str(tmp_path / "new"), ["nope/*"])
  with pytest.raises(ReplayError, match="is not an ember checkout"): capture_tree(str(tmp_path), str(tmp_path / "x"))

def test_a_recorder_that_sees_no_schedule_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  import contextlib
  from ember.replay import pipeline
  monkeypatch.setattr(pipeline, "recording", lambda kernels: contextlib.nullcontext())  # as if run_schedule moved
  with pytest.raises(ReplayError, match="no schedule reached the recorder"): capture(str(tmp_path / "c"), SMALL)

def _checkout() -> Path | None:
  """The checkout these tests come from (the nox sessions install ember from it, so its sources are the ones tested)."""
  root = Path(__file__).resolve().parents[3]
  return root if (root / "packages" / "core" / "src" / "ember" / "__init__.py").exists() else None

@pytest.mark.skipif(_checkout() is None, reason="these tests do not run from a source checkout (packages/*/src)")
def test_capture_of_a_tree_in_a_child_process_matches_the_in_process_capture(tmp_path: Path) -> None:
  root = _checkout()
  assert root is not None
  here = capture(str(tmp_path / "here"), ["api/matmul"])
  assert capture_tree(str(root), str(tmp_path / "tree"), ["api/matmul"]) == 0
  tree = json.loads((tmp_path / "tree" / "manifest.json").read_text())
  assert tree["kernels"] == here["kernels"] and tree["workloads"] == here["workloads"]
  common = set(here["renderers"]) & set(tree["renderers"])
  assert "PYTHON:PYTHON" in common
  for label in common:
    folder = label.replace(":", "-")
    for key in here["kernels"]:
      ours, theirs = (tmp_path / side / folder / f"{key}.txt" for side in ("here", "tree"))
      assert ours.read_text() == theirs.read_text()
