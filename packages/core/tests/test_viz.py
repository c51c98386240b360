"""VIZ and TRACK_MATCH_STATS: what the recorder captures (passes, rules and where they are written, match counts,
kernels with their AST, program, source and time), that its step graphs replay to the rewrite's result, the saved
trace round trip, the server's JSON API and the env-var entry points (VIZ=file.json, TRACK_MATCH_STATS=1,
`python -m ember.viz FILE`). Oracles: the rewrite run without recording, get_program run directly, the test's own
rule table. The page itself is driven in a browser by tests/browser/test_viz_page.py."""
from __future__ import annotations
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Iterator
import numpy as np
import pytest
import ember.viz as viz
from ember import Context, Device, Tensor
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.errors import VizError
from ember.uop import rewrite
from ember.uop.ops import AxisType, Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat, graph_rewrite
from ember.viz.record import Recorder, format_rule_table
from ember.viz.server import LiveTrace, SavedTrace, make_server, pick_port

DEVICE = "PYTHON"

def _fold_double_neg(x: UOp) -> UOp: return x

TABLE_LINE = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
pm_test = PatternMatcher([
  (UPat.var("x") * 1, lambda x: x),  # x*1 -> x
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), _fold_double_neg),  # --x -> x
])

def _graph() -> tuple[UOp, int, int]:
  """A graph with three x*1 and two --x, the counts the oracle expects."""
  a, b = UOp.variable("a", 0, 9, dtypes.float32), UOp.variable("b", 0, 9, dtypes.float32)
  muls = [(a * 1), (b * 1), ((a + b) * 1)]
  negs = [a.alu(Ops.NEG).alu(Ops.NEG), (a * b).alu(Ops.NEG).alu(Ops.NEG)]
  return UOp.sink(*muls, *negs), 3, 2

def test_rules_are_named_by_callback_or_comment_and_located_at_their_table_line():
  sink, n_mul, n_neg = _graph()
  expected = graph_rewrite(sink, pm_test, name="test pass")  # the oracle: the same rewrite, not recorded
  with viz.record() as rec:
    got = graph_rewrite(sink, pm_test, name="test pass")
  assert got is expected
  passes = [r for k in rec.kernels for r in k.rewrites if r.name == "test pass"]
  assert len(passes) == 1 and passes[0].matches == n_mul + n_neg and passes[0].result is expected
  stats = {s.name: s for s in rec.rules.values()}
  here = os.path.basename(__file__)
  assert stats["x*1 -> x"].matches == n_mul and stats["x*1 -> x"].location.endswith(f"{here}:{TABLE_LINE}")
  assert stats["_fold_double_neg"].matches == n_neg and stats["_fold_double_neg"].comment == "--x -> x"
  assert stats["_fold_double_neg"].location.endswith(f"{here}:{TABLE_LINE + 1}")
  assert all(s.tries >= s.matches and s.seconds >= 0 for s in stats.values())
  assert rewrite.TRACER is None  # the block put the previous (no) tracer back

def test_passes_outside_kernels_are_listed_only_when_they_rewrote():
  a = UOp.variable("a", 0, 9, dtypes.float32)
  with viz.record() as rec:
    graph_rewrite(a * 2, pm_test, name="no-op pass")  # a MUL the x*1 rule is tried on, and does not match
    graph_rewrite(_graph()[0], pm_test, name="test pass")
  assert [r.name for k in rec.kernels for r in k.rewrites] == ["test pass"]
  stats = {s.name: s for s in rec.rules.values()}
  # tried once more than it matched: on a*2 (a*b has no constant operand, so the table rejects it without a try)
  assert stats["x*1 -> x"].tries == stats["x*1 -> x"].matches + 1

def test_steps_replay_to_the_rewrites_result():
  sink, n_mul, n_neg = _graph()
  with viz.record() as rec:
    result = graph_rewrite(sink, pm_test, name="test pass")
  record = next(r for k in rec.kernels for r in k.rewrites if r.name == "test pass")
  detail = rec.export_rewrite(record)
  steps, nodes = detail["steps"], detail["nodes"]
  assert len(steps) == 1 + n_mul + n_neg and steps[0]["rule"] is None
  def reachable(i: int) -> set[int]:
    seen, stack = set(), [i]
    while stack:
      if (n := stack.pop()) not in seen:
        seen.add(n)
        stack.extend(nodes[n]["src"])
    return seen
  assert steps[0]["nodes"] == len(reachable(steps[0]["sink"])) == len(sink.toposort())
  last = reachable(steps[-1]["sink"])
  assert steps[-1]["nodes"] == len(last) == len(result.toposort())
  assert sorted(nodes[i]["op"] for i in last) == sorted(u.op.name for u in result.toposort())
  rule_names = [list(rec.rules.values())[s["rule"]].name for s in steps[1:]]
  assert sorted(rule_names) == sorted(["x*1 -> x"] * n_mul + ["_fold_double_neg"] * n_neg)
  for s in steps[1:]:  # each step names the node it matched (in the graph before it) and its replacement
    assert nodes[s["match"]]["op"] in ("MUL", "NEG") and s["replacement"] in reachable(s["sink"])

def _inner_mul(x: UOp) -> UOp | None:
  """A rule that runs a rewrite of its own (as codegen's rules do through UOp.simplify): nested graph_rewrites."""
  inner = graph_rewrite(x.src[0], pm_test, name="inner pass")
  return None if inner is x.src[0] else x.replace(src=(inner,))

pm_outer = PatternMatcher([(UPat(Ops.CAST, name="x"), _inner_mul)])

@pytest.mark.parametrize("bottom_up", [False, True])
def test_bottom_up_and_nested_rewrites_record_the_same_result(bottom_up):
  sink, _, _ = _graph()
  graph = UOp.sink(*(s.cast(dtypes.float64) for s in sink.src))
  expected = graph_rewrite(graph_rewrite(graph, pm_outer, bottom_up=bottom_up), pm_test, bottom_up=bottom_up)
  with viz.record() as rec:
    got = graph_rewrite(graph_rewrite(graph, pm_outer, bottom_up=bottom_up, name="outer"), pm_test,
                        bottom_up=bottom_up, name="test pass")
  assert got is expected
  passes = {r.name: r for k in rec.kernels for r in k.rewrites}
  # the inner passes did every rewrite, so the last pass made none and is not listed (outside a kernel)
  assert {"outer", "inner pass"} <= set(passes) and "test pass" not in passes
  for record in rec.kernels[0].rewrites:  # every pass replays, step by step, to what it returned
    last = rec.export_rewrite(record)["steps"][-1]
    assert last["nodes"] == len(record.result.toposort())

@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[Recorder, np.ndarray, np.ndarray]]:
  """A small training-like program on the PYTHON device: a matmul, its gradient, an SGD-style update."""
  rng = np.random.default_rng(0)
  xs, ws = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
  with viz.record() as rec:
    x, w = Tensor(xs, device=DEVICE), Tensor(ws, device=DEVICE, requires_grad=True)
    loss = (x @ w).relu().sum()
    loss.backward()
    assert w.grad is not None
    new_w = (w - 0.1 * w.grad).numpy()
  mask = (xs @ ws > 0).astype(np.float32)
  yield rec, new_w, ws - 0.1 * xs.T @ mask

def test_kernels_carry_ast_program_source_opts_and_time(recorded):
  rec, got, want = recorded
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  kernels = [k for k in rec.kernels if k.kind == "kernel"]
  assert kernels and all(k.device == DEVICE for k in kernels)
  renderer = Device[DEVICE].renderer
  data = viz.trace(rec)
  exported = {(k["name"], k["source"]): k for k in data["kernels"] if k["kind"] == "kernel"}
  for k in kernels:
    assert k.ast is not None
    spec = get_program(k.ast, renderer, DEVICE)  # the oracle: codegen of the same AST, not recorded
    assert (k.name, k.src) == (spec.name, spec.src) and k.uops == spec.uops
    names = [r.name for r in k.rewrites]
    assert names[0] == "kernel AST" and "simplify index math" in names and "guard integer division" in names
    entry = exported[(k.name, k.src)]
    assert entry["program"].count("\n") + 1 == len(spec.uops) and entry["ast"].startswith("x0 = ")
    assert entry["time_s"] is not None and entry["time_s"] > 0 and entry["runs"] >= 1
  # the scheduler's tensor graphs come first, with shapes on their nodes
  schedule = next(k for k in data["kernels"] if k["kind"] == "schedule")
  assert schedule["rewrites"][0]["name"] == "tensor graph"
  shapes = {n.get("shape") for n in schedule["rewrites"][0]["nodes"]}
  assert "(4, 3)" in shapes or "(3, 2)" in shapes
  timeline = data["timeline"]
  assert {e["name"] for e in timeline if e["ph"] == "X" and e["cat"] == "kernel"} >= {k.name for k in kernels}

def _add_one(out: UOp, x: UOp) -> UOp:
  i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
  return out[i].store(x[i] + 1).end(i).sink()

def test_a_hand_written_kernel_is_listed_with_its_source():
  x = Tensor.arange(4, device=DEVICE).realize()
  with viz.record() as rec:
    out = Tensor.custom_kernel(Tensor.empty(4, dtype=x.dtype, device=DEVICE), x, fxn=_add_one)[0]
    assert out.tolist() == [1, 2, 3, 4]
  kernels = [k for k in rec.kernels if k.kind == "kernel"]
  assert len(kernels) == 1 and kernels[0].ast is not None
  spec = get_program(kernels[0].ast, Device[DEVICE].renderer, DEVICE)  # the oracle: its codegen, not recorded
  assert (kernels[0].name, kernels[0].src) == (spec.name, spec.src)

def test_track_match_stats_without_graphs_counts_and_prints_a_table():
  sink, n_mul, n_neg = _graph()
  with viz.record(graphs=False) as rec:
    graph_rewrite(sink, pm_test, name="test pass")
  assert rec.kernels == []  # counts only, no graphs kept
  rows = rec.rule_table()
  assert {r.name: r.matches for r in rows if r.name in ("x*1 -> x", "_fold_double_neg")} == \
    {"x*1 -> x": n_mul, "_fold_double_neg": n_neg}
  table = format_rule_table(rows)
  assert "x*1 -> x" in table and f"test_viz.py:{TABLE_LINE}" in table

def test_trace_saves_and_loads_and_a_bad_file_is_a_viz_error(recorded, tmp_path):
  rec = recorded[0]
  path = tmp_path / "trace.json"
  viz.save(str(path), rec)
  assert viz.load(str(path)) == json.loads(json.dumps(viz.trace(rec)))
  (tmp_path / "bad.json").write_text('{"traceEvents": []}')
  with pytest.raises(VizError, match="not a VIZ trace"): viz.load(str(tmp_path / "bad.json"))
  (tmp_path / "garbage.json").write_text("not json")
  with pytest.raises(ValueError, match="not JSON"): viz.load(str(tmp_path / "garbage.json"))

def _get(url: str) -> tuple[int, dict[str, str], bytes]:
  try:
    with urllib.request.urlopen(url) as r: return r.status, dict(r.headers), r.read()
  except urllib.error.HTTPError as e: return e.code, dict(e.headers), e.read()

@pytest.mark.parametrize("saved", [False, True])
def test_server_answers_its_json_api(recorded, saved):
  rec = recorded[0]
  source = SavedTrace(viz.trace(rec)) if saved else LiveTrace(rec, viz.profile_events(rec))
  server = make_server(source, 0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{server.server_address[1]}"
  try:
    status, headers, body = _get(base + "/")
    assert status == 200 and b"/viz.js" in body and "script-src 'self'" in headers["Content-Security-Policy"]
    assert _get(base + "/viz.js")[0] == 200 and _get(base + "/viz.css")[0] == 200
    summary = json.loads(_get(base + "/api/trace")[2])
    assert [k["name"] for k in summary["kernels"]] == [k.name for k in rec.kernels]
    k = next(i for i, kernel in enumerate(rec.kernels) if kernel.kind == "kernel")
    r = next(i for i, p in enumerate(rec.kernels[k].rewrites) if p.matches)
    assert summary["kernels"][k]["rewrites"][r]["matches"] == rec.kernels[k].rewrites[r].matches
    assert "nodes" not in summary["kernels"][k]["rewrites"][r]  # graphs only on request
    detail = json.loads(_get(base + f"/api/rewrite?kernel={k}&rewrite={r}")[2])
    oracle = rec.export_rewrite(rec.kernels[k].rewrites[r])
    assert detail["steps"] == oracle["steps"] and detail["nodes"] == oracle["nodes"]
    status, _, body = _get(base + f"/api/rewrite?kernel={len(rec.kernels)}&rewrite=0")
    assert status == 404 and "no pass 0 of kernel" in json.loads(body)["error"]
    status, _, body = _get(base + "/api/rewrite?kernel=x")
    assert status == 404 and "integer kernel=" in json.loads(body)["error"]
    assert _get(base + "/nothing")[0] == 404
  finally:
    server.shutdown()
    server.server_close()

# a transpose: its index math gives the symbolic rules something to fold
def test_a_port_in_use_says_how_to_choose_another(recorded):
  source = SavedTrace(viz.trace(recorded[0]))
  taken = make_server(source, 0)
  try:
    with pytest.raises(OSError, match="VIZ_PORT=<port>"): make_server(source, taken.server_address[1])
  finally: taken.server_close()
  with Context(VIZ_PORT=0): assert pick_port() == 0 and pick_port(1234) == 1234

PROGRAM = ("from ember import Tensor\n"
           "print((Tensor.arange(12, device='PYTHON').reshape(3, 4).T.contiguous() * 2).sum().item())")

def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
  return subprocess.run([sys.executable, "-c", PROGRAM], env={**os.environ, **env}, capture_output=True, text=True,
                        timeout=300)

def test_viz_file_saves_a_trace_the_cli_serves(tmp_path):
  path = tmp_path / "run.json"
  out = _run({"VIZ": str(path)})
  assert out.returncode == 0, out.stderr
  assert float(out.stdout) == 2 * sum(range(12)) and f"trace saved to {path}" in out.stderr
  data = viz.load(str(path))
  kernels = [k for k in data["kernels"] if k["kind"] == "kernel"]
  assert kernels and all(k["source"] and k["rewrites"][0]["steps"] for k in kernels)
  cli = subprocess.Popen([sys.executable, "-m", "ember.viz", str(path), "--port", "0"], stderr=subprocess.PIPE,
                         text=True)
  try:
    assert cli.stderr is not None
    line = cli.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert match, line
    summary = json.loads(_get(f"http://127.0.0.1:{match.group(1)}/api/trace")[2])
    assert [k["name"] for k in summary["kernels"]] == [k["name"] for k in data["kernels"]]
  finally:
    cli.terminate()
    cli.wait(timeout=30)

def test_track_match_stats_prints_the_rule_table_at_exit():
  out = _run({"TRACK_MATCH_STATS": "1"})
  assert out.returncode == 0, out.stderr
  assert "TRACK_MATCH_STATS:" in out.stderr and re.search(r"ember/uop/symbolic\.py:\d+", out.stderr)
  quiet = _run({})
  assert "TRACK_MATCH_STATS" not in quiet.stderr

def test_cli_refuses_a_file_that_is_not_a_trace(tmp_path):
  path = tmp_path / "profile.json"
  path.write_text(json.dumps({"traceEvents": []}))
  out = subprocess.run([sys.executable, "-m", "ember.viz", str(path)], capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "is not a VIZ trace" in out.stderr
