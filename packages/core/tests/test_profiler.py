"""The profiler (issue 18): `ember.profile()` / PROFILE=1 record kernels, copies, allocations, codegen, compiles and
TinyJit replays as Chrome trace events; `p.table()` ranks kernels; DEBUG=2 prints the same kernels with the same
times. The training step's numbers come from a numpy oracle; the trace is checked against the trace-event format
(ember.testing.trace_format, written from the format's definition)."""
from __future__ import annotations
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import uuid
import numpy as np
import pytest
import ember
from ember import Context, Tensor, TinyJit, profiler
from ember.errors import ProfileError
from ember.helpers import ansistrip
from ember.testing.trace_format import assert_valid_trace, trace_problems

_DEBUG_LINE = re.compile(r"^\*\*\* (\S+)\s+\d+ (\S+)\s+tm\s+([\d.]+)us")

def debug_kernels(stderr: str) -> list[tuple[str, str, float]]:
  """(device, kernel name, microseconds) of each kernel line DEBUG=2 printed."""
  return [(m[1], m[2], float(m[3])) for ln in stderr.splitlines() if (m := _DEBUG_LINE.match(ansistrip(ln)))]

def kernel_events(trace: dict) -> list[dict]: return [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]

def track_names(trace: dict) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
  meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
  return ({e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"},
          {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"})

# ** the JIT'd MLP training step, and its numpy oracle **

LR = 0.1

def mlp_data(steps: int) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
  rng = np.random.default_rng(18)
  w1 = (rng.standard_normal((8, 16)) * 0.3).astype(np.float32)
  w2 = (rng.standard_normal((16, 4)) * 0.3).astype(np.float32)
  batches = [(rng.standard_normal((32, 8)).astype(np.float32), rng.standard_normal((32, 4)).astype(np.float32))
             for _ in range(steps)]
  return w1, w2, batches

def numpy_training(w1: np.ndarray, w2: np.ndarray, batches: list) -> tuple[list[float], np.ndarray, np.ndarray]:
  w1, w2, losses = w1.astype(np.float64), w2.astype(np.float64), []
  for x, y in batches:
    h = x @ w1
    a = np.maximum(h, 0)
    out = a @ w2
    losses.append(float(((out - y) ** 2).mean()))
    d_out = 2 * (out - y) / out.size
    g2 = a.T @ d_out
    g1 = x.T @ ((d_out @ w2.T) * (h > 0))
    w1, w2 = w1 - LR * g1, w2 - LR * g2
  return losses, w1, w2

def make_step(w1: Tensor, w2: Tensor) -> TinyJit:
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
    g1, g2 = loss.gradient(w1, w2)
    w1.assign(w1 - LR * g1)
    w2.assign(w2 - LR * g2)
    Tensor.realize(loss, w1, w2)
    return loss
  return step

@pytest.fixture(scope="module")
def profiled_training() -> dict:
  """Four steps of a JIT'd MLP (run, capture, two replays) profiled at DEBUG=2: the trace, DEBUG=2's kernel lines,
  the profile, the losses and weights, and the numpy oracle's."""
  w1_np, w2_np, batches = mlp_data(4)
  w1, w2 = Tensor(w1_np, requires_grad=True).realize(), Tensor(w2_np, requires_grad=True).realize()
  step = make_step(w1, w2)
  inputs = [(Tensor(x).realize(), Tensor(y).realize()) for x, y in batches]
  stderr = io.StringIO()  # DEBUG=2 writes to sys.stderr (a module fixture cannot use capsys)
  with contextlib.redirect_stderr(stderr), Context(DEBUG=2), ember.profile() as p:
    losses = [step(x, y).item() for x, y in inputs]
  return {"trace": {"traceEvents": p.trace_events(), "displayTimeUnit": "ms"},
          "debug": debug_kernels(stderr.getvalue()), "profile": p, "losses": losses, "w1": w1.numpy(),
          "w2": w2.numpy(), "step": step, "oracle": numpy_training(w1_np, w2_np, batches)}

def test_profiled_training_computes_what_numpy_does(profiled_training):
  losses, w1, w2 = profiled_training["oracle"]
  np.testing.assert_allclose(profiled_training["losses"], losses, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(profiled_training["w1"], w1, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(profiled_training["w2"], w2, rtol=1e-4, atol=1e-5)

def test_training_trace_is_valid_trace_event_json(profiled_training):
  assert_valid_trace(profiled_training["trace"])

def test_training_kernels_and_times_match_debug_2(profiled_training):
  debug = profiled_training["debug"]
  events = kernel_events(profiled_training["trace"])
  processes, _ = track_names(profiled_training["trace"])
  assert len(debug) >= 8 and len(events) == len(debug)
  for (device, name, us), e in zip(debug, events):
    assert (processes[e["pid"]], e["name"]) == (device, name)
    assert e["dur"] == pytest.approx(us, abs=0.006)  # DEBUG=2 prints two decimals

def test_jit_replays_are_events_holding_their_kernels(profiled_training):
  trace, step = profiled_training["trace"], profiled_training["step"]
  replays = [e for e in trace["traceEvents"] if e.get("cat") == "jit"]
  assert [e["name"] for e in replays] == ["TinyJit make_step.<locals>.step"] * 2  # calls 3 and 4 replay
  n_kernels = sum(runner is not None for runner, _, _ in step.captured)
  replayed = [e for e in kernel_events(trace) if e["args"]["jit"]]
  assert len(replayed) == 2 * n_kernels and all(e["args"]["calls"] == len(step.captured) for e in replays)
  for replay, kernels in zip(replays, (replayed[:n_kernels], replayed[n_kernels:])):
    assert all(replay["ts"] <= k["ts"] and k["ts"] + k["dur"] <= replay["ts"] + replay["dur"] + 1e-3 for k in kernels)
    assert [k["name"] for k in kernels] == [runner.spec.name for runner, _, _ in step.captured if runner is not None]

def test_table_ranks_kernels_by_total_time_like_debug_2(profiled_training):
  debug, p = profiled_training["debug"], profiled_training["profile"]
  totals: dict[str, list[float]] = {}
  for _, name, us in debug: totals.setdefault(name, []).append(us)
  stats = p.kernels()
  assert {s.name: s.count for s in stats} == {name: len(ts) for name, ts in totals.items()}
  for s in stats: assert s.seconds * 1e6 == pytest.approx(sum(totals[s.name]), abs=0.006 * s.count)
  assert [s.seconds for s in stats] == sorted((s.seconds for s in stats), reverse=True)
  events = kernel_events(profiled_training["trace"])
  for s in stats:  # GFLOP/s and GB/s: the kernels' op and byte estimates over their total time
    mine = [e for e in events if e["name"] == s.name]
    seconds = sum(e["dur"] for e in mine) / 1e6
    assert s.gflops == pytest.approx(sum(e["args"]["ops"] for e in mine) / seconds / 1e9, rel=1e-9)
    assert s.gbs == pytest.approx(sum(e["args"]["bytes"] for e in mine) / seconds / 1e9, rel=1e-9)
  rows = p.table(limit=None).splitlines()
  assert rows[0].split()[:4] == ["kernel", "device", "count", "total"]
  assert [row.split()[0] for row in rows[1:1 + len(stats)]] == [s.name for s in stats]
  assert rows[-1].startswith(f"{len(stats)} kernels, {len(debug)} launches")
  assert p.table(limit=1).splitlines()[2] == f"... {len(stats) - 1} more kernels"

# ** what else is recorded: allocations, copies, codegen, compiles **

def test_new_kernel_records_codegen_compile_alloc_and_copies():
  data = np.arange(37, dtype=np.float32) + np.float32(uuid.uuid4().int % 1000)  # new constants: a kernel never built
  with ember.profile() as p:
    t = Tensor(data).realize()
    out = (t * 3 + 1).realize()
    moved = out.to("PYTHON:1").realize()
    result = moved.numpy()
  np.testing.assert_array_equal(result, data * 3 + 1)
  trace = {"traceEvents": p.trace_events()}
  assert_valid_trace(trace)
  processes, threads = track_names(trace)
  by_kind: dict[str, list[dict]] = {}
  for e in trace["traceEvents"]:
    if e["ph"] == "X": by_kind.setdefault(e["cat"], []).append(e)
  kernel = by_kind["kernel"][0]
  assert [e["name"] for e in by_kind["codegen"]] == [kernel["name"]]
  assert kernel["name"] in [e["name"] for e in by_kind["compile"]]
  assert any(e["args"]["bytes"] == data.nbytes for e in by_kind["alloc"])
  copies = [(processes[e["pid"]], threads[(e["pid"], e["tid"])], e["name"]) for e in by_kind["copy"]]
  device = processes[kernel["pid"]]
  assert (device, "copy", f"copyin {data.nbytes} B") in copies  # Tensor(data) onto the default device
  assert ("PYTHON:1", "copy", f"copy {device} -> PYTHON:1") in copies  # .to() as a scheduled copy
  assert ("PYTHON:1", "copy", f"copyout {data.nbytes} B") in copies  # .numpy()
  assert threads[(kernel["pid"], kernel["tid"])] == "compute"

def test_nothing_is_recorded_when_no_profile_is_open():
  with ember.profile() as p: (Tensor(np.ones(8, np.float32)) + 1).realize()
  assert not profiler.enabled and p.events
  recorded = len(profiler._log)
  (Tensor(np.ones(9, np.float32)) * 2).numpy()
  assert len(profiler._log) == recorded == len(p.events)

def test_a_closed_profile_keeps_its_events_and_the_next_one_starts_afresh():
  with ember.profile() as first: (Tensor(np.ones(10, np.float32)) + 1).realize()
  kept = list(first.events)
  with ember.profile() as second: (Tensor(np.ones(11, np.float32)) + 1).realize()
  assert first.events == kept and second.events and not set(map(id, kept)) & set(map(id, second.events))
  assert profiler._log is not first._log  # the module keeps only the latest profiles' events
  assert len(profiler.trace_events()) == len(second.trace_events())

def test_nested_profiles_each_hold_their_own_span():
  with ember.profile() as outer:
    (Tensor(np.ones(5, np.float32)) + 1).realize()
    with ember.profile() as inner: (Tensor(np.ones(6, np.float32)) + 2).realize()
    assert profiler.enabled
  assert not profiler.enabled
  assert inner.events and set(map(id, inner.events)) < set(map(id, outer.events))
  def spans(events: list[dict]) -> list[tuple]: return [(e["name"], e["cat"], e["ts"], e["dur"]) for e in events
                                                       if e["ph"] == "X"]
  assert spans(profiler.trace_events())[-len(inner.events):] == spans(inner.trace_events())

def test_profile_writes_its_trace_to_the_path(tmp_path):
  path = tmp_path / "trace.json"
  with ember.profile(path) as p: (Tensor(np.ones(4, np.float32)) * 5).numpy()
  trace = json.loads(path.read_text())
  assert_valid_trace(trace)
  assert trace["traceEvents"] == p.trace_events()

def test_profile_misuse_raises_typed_errors(tmp_path):
  with pytest.raises(ProfileError, match="does not exist") as e: ember.profile(tmp_path / "missing" / "trace.json")
  assert isinstance(e.value, ValueError)
  p = ember.profile()
  with p: pass
  with pytest.raises(ProfileError, match="already started"), p: pass

# ** the trace checker itself rejects what the format forbids **

def _valid() -> dict:
  return {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "CPU"}},
                          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "compute"}},
                          {"name": "k", "cat": "kernel", "ph": "X", "ts": 1.5, "dur": 2, "pid": 1, "tid": 1,
                           "args": {}},
                          {"name": "k2", "cat": "kernel", "ph": "X", "ts": 2, "dur": 1, "pid": 1, "tid": 1,
                           "args": {}}],
          "displayTimeUnit": "ms"}

@pytest.mark.parametrize("break_it, problem", [
  (lambda t: t["traceEvents"][2].pop("dur"), "missing"),
  (lambda t: t["traceEvents"][2].update(dur=-1), "non-negative"),
  (lambda t: t["traceEvents"][2].update(ts=float("nan")), "not plain JSON"),
  (lambda t: t["traceEvents"][2].update(ph="B"), "neither"),
  (lambda t: t["traceEvents"][2].update(pid="1"), "integers"),
  (lambda t: t["traceEvents"][2].update(tid=True), "integers"),
  (lambda t: t["traceEvents"][2].update(extra=1), "unexpected"),
  (lambda t: t["traceEvents"].pop(1), "no thread_name"),
  (lambda t: t["traceEvents"].pop(0), "no process_name"),
  (lambda t: t["traceEvents"][0]["args"].update(name=3), "not a str"),
  (lambda t: t["traceEvents"].append(dict(t["traceEvents"][1])), "named twice"),
  (lambda t: t["traceEvents"][3].update(ts=3, dur=5), "without nesting"),
  (lambda t: t.update(displayTimeUnit="s"), "displayTimeUnit"),
  (lambda t: t.pop("traceEvents"), "traceEvents"),
])
def test_trace_checker_rejects_malformed_traces(break_it, problem):
  trace = _valid()
  assert trace_problems(trace) == []
  break_it(trace)
  assert any(problem in p for p in trace_problems(trace)), trace_problems(trace)

# ** PROFILE=1 / PROFILE=path and DEBUG=2's table at exit, in a fresh process **

PROGRAM = """
import numpy as np
from ember import Tensor
x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8))
print(float(((x @ x).relu().sum()).item()))
"""

def _run(env: dict[str, str], tmp_path) -> subprocess.CompletedProcess[str]:
  return subprocess.run([sys.executable, "-c", PROGRAM], env={**os.environ, **env}, capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)

def test_profile_env_path_writes_a_valid_trace(tmp_path):
  path = tmp_path / "program.json"
  proc = _run({"PROFILE": str(path)}, tmp_path)
  assert proc.returncode == 0, proc.stderr
  x = np.arange(64, dtype=np.float32).reshape(8, 8)
  assert float(proc.stdout) == pytest.approx(float(np.maximum(x @ x, 0).sum()))
  assert "PROFILE: wrote" in proc.stderr and str(path) in proc.stderr
  trace = json.loads(path.read_text())
  assert_valid_trace(trace)
  assert len(kernel_events(trace)) >= 1

def test_profile_1_writes_to_a_temporary_file_and_says_where(tmp_path):
  proc = _run({"PROFILE": "1"}, tmp_path)
  assert proc.returncode == 0, proc.stderr
  m = re.search(r"PROFILE: wrote \d+ events to (\S+)", proc.stderr)
  assert m is not None, proc.stderr
  try: assert_valid_trace(json.loads(open(m[1]).read()))
  finally: os.unlink(m[1])

def test_debug_2_program_prints_the_kernel_table_at_exit(tmp_path):
  proc = _run({"DEBUG": "2"}, tmp_path)
  assert proc.returncode == 0, proc.stderr
  debug = debug_kernels(proc.stderr)
  table = proc.stderr.split("kernels by total time (DEBUG=2):\n", 1)[1].splitlines()
  names = {name for _, name, _ in debug}
  assert [row.split()[0] for row in table[1:1 + len(names)]] == \
         sorted(names, key=lambda n: -sum(us for _, k, us in debug if k == n))
  assert table[-1].startswith(f"{len(names)} kernels, {len(debug)} launches")

def test_stale_device_timestamps_fall_back_to_host_time(monkeypatch):
  # a device with a timer whose last stamps are not this launch's (another runtime ran the kernel): host time, the
  # Program's own seconds as the duration
  from ember.device import Device
  x = Tensor(np.ones(12, np.float32)).realize()
  dev = Device[x.device]
  monkeypatch.setattr(type(dev), "launch_timestamps_ns", lambda self: (1_000, 2_000_000_000))
  with ember.profile() as p: (x * 7).realize()
  kernels = [e for e in p.events if e.kind == "kernel"]
  assert kernels and all(e.args["timer"] == "host" and "device_start_ns" not in e.args for e in kernels)
  assert all(e.dur_us < 2e6 for e in kernels)
