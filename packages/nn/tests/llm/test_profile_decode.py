"""Profiling ember-llm (issue 18): decoding the tiny test llama inside `ember.profile()` at DEBUG=2 gives a trace that
passes the trace-event checker, whose kernels and times are DEBUG=2's, with the TinyJit'd decode steps as replays; the
tokens are the numpy oracle's greedy ones. `ember-llm --profile FILE` writes such a trace."""
from __future__ import annotations
import contextlib
import io
import json
import re
import numpy as np
from ember import Context, profile
from ember.helpers import ansistrip
from ember.nn.llm import __main__ as cli
from ember.nn.llm.generate import generate
from ember.nn.llm.model import Llama
from ember.testing.trace_format import assert_valid_trace

PROMPT = [5, 77, 200]
_DEBUG_LINE = re.compile(r"^\*\*\* (\S+)\s+\d+ (\S+)\s+tm\s+([\d.]+)us")

def debug_kernels(stderr: str) -> list[tuple[str, float]]:
  return [(m[2], float(m[3])) for ln in stderr.splitlines() if (m := _DEBUG_LINE.match(ansistrip(ln)))]

def test_profiled_decode_matches_debug_2_and_the_oracle(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  err = io.StringIO()
  with contextlib.redirect_stderr(err), Context(DEBUG=2), profile() as p:
    tokens = generate(model, PROMPT, 6)
  ref = list(PROMPT)
  for _ in range(6): ref.append(int(np.argmax(reference_logits(hf, cfg, ref)[-1])))
  assert tokens == ref[len(PROMPT):]
  trace = {"traceEvents": p.trace_events(), "displayTimeUnit": "ms"}
  assert_valid_trace(trace)
  kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
  debug = debug_kernels(err.getvalue())
  assert len(kernels) == len(debug) > 0
  for (name, us), e in zip(debug, kernels):
    assert e["name"] == name and abs(e["dur"] - us) <= 0.006  # DEBUG=2 prints two decimals
  # decode steps 3..5 replay the step TinyJit captured (step 1 runs it, step 2 captures): each replay holds its kernels
  replays = [e for e in trace["traceEvents"] if e.get("cat") == "jit"]
  assert len(replays) >= 3 and all(e["name"].startswith("TinyJit ") for e in replays)
  replayed = [e for e in kernels if e["args"]["jit"]]
  assert 0 < len(replayed) <= sum(e["args"]["calls"] for e in replays)  # a capture's copies are no kernels
  for r in replays:
    inside = [k for k in replayed if r["ts"] <= k["ts"] <= r["ts"] + r["dur"]]
    assert 0 < len(inside) <= r["args"]["calls"]
  ranked = p.kernels()
  assert sum(s.count for s in ranked) == len(kernels)
  assert [s.seconds for s in ranked] == sorted((s.seconds for s in ranked), reverse=True)

def test_cli_profile_writes_a_trace_of_the_run(tiny_llama, tmp_path):
  path, _, _ = tiny_llama
  trace_path = tmp_path / "run.json"
  out, err = io.StringIO(), io.StringIO()
  argv = ["--model", str(path), "--prompt", " the", "--max-tokens", "5", "--profile", str(trace_path), "--stats"]
  assert cli.main(argv, out=out, err=err) == 0
  assert out.getvalue().startswith(" the")
  trace = json.loads(trace_path.read_text())
  assert_valid_trace(trace)
  cats = {e.get("cat") for e in trace["traceEvents"]}
  assert {"kernel", "copy", "alloc", "jit"} <= cats
  assert f"events written to {trace_path}" in err.getvalue()
  table = err.getvalue().split("events written to", 1)[1].splitlines()[1:]
  assert table[0].split()[:3] == ["kernel", "device", "count"] and "launches" in table[-1]

def test_cli_profile_to_a_missing_folder_is_a_usage_error(tiny_llama, tmp_path):
  path, _, _ = tiny_llama
  err = io.StringIO()
  argv = ["--model", str(path), "--prompt", " the", "--profile", str(tmp_path / "nope" / "run.json")]
  assert cli.main(argv, out=io.StringIO(), err=err) == cli.EXIT_USAGE
  assert "--profile" in err.getvalue() and "does not exist" in err.getvalue()
