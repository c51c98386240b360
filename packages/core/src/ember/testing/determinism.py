"""Schedule replay-corpus programs in a fresh process (a chosen PYTHONHASHSEED, optionally after other programs) and
return each one's kernels in order: what a test compares across processes to show scheduling does not depend on hash
seeds, object addresses or earlier work. Programs named `nn/...` need ember-nn installed."""
from __future__ import annotations
import json
import os
import subprocess
import sys

_CHILD = """
import json, sys
from ember.replay.record import run_corpus
first, names = json.loads(sys.argv[1])
if first: run_corpus(first)
corpus = run_corpus(names)
out = {n: [[k, corpus.kernels[k].name] for k in w["kernels"]] for n, w in corpus.workloads.items()}
print(json.dumps({"errors": [w["error"] for w in corpus.workloads.values()], "kernels": out}))
"""

def schedule_in_child(programs: list[str], hashseed: str, first: list[str] | None = None) -> dict:
  """{"errors": [per program: None or its error], "kernels": {program: [[kernel key, kernel name], ...]}}, scheduled
  in a new interpreter with PYTHONHASHSEED=`hashseed` after running `first`."""
  env = {**os.environ, "PYTHONHASHSEED": hashseed}
  proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([first or [], programs])], env=env,
                        capture_output=True, text=True, timeout=300, check=True)
  return json.loads(proc.stdout.splitlines()[-1])

def assert_schedules_identical(programs: list[str], other_work: list[str]) -> None:
  """`programs` schedule the same kernels (keys and names) in the same order under PYTHONHASHSEED 0, 1 and 2, and
  under 3 after `other_work` ran in the same process."""
  runs = [schedule_in_child(programs, seed) for seed in ("0", "1", "2")]
  runs.append(schedule_in_child(programs, "3", other_work))
  assert runs[0]["errors"] == [None] * len(programs), runs[0]["errors"]
  assert all(len(runs[0]["kernels"][name]) > 0 for name in programs)
  for run in runs[1:]:
    for name in programs:
      assert run["kernels"][name] == runs[0]["kernels"][name], f"{name} scheduled differently in another process"
