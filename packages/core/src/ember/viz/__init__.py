"""VIZ: every graph_rewrite of every kernel, in the browser; TRACK_MATCH_STATS: how often each rule fired.

  VIZ=1 python train.py              # at exit, serves the UI on http://127.0.0.1:8000 (VIZ_PORT to choose)
  VIZ=trace.json python train.py     # at exit, saves the trace instead
  python -m ember.viz trace.json     # serves a saved trace
  TRACK_MATCH_STATS=1 python train.py  # at exit, prints per-rule match counts and times (2: every rule tried)

In a program: `with ember.viz.record() as rec: ...` records a block; `ember.viz.serve()` serves what was recorded so
far (blocks until Ctrl-C). The flags are read at `import ember`; recording off costs one branch per graph_rewrite.
docs/viz.md describes the page.
"""
from __future__ import annotations
import atexit
import contextlib
import json
import os
import sys
from typing import Any, Iterator
from ember.errors import VizError
from ember.helpers import TRACK_MATCH_STATS, VIZ
from ember.uop import rewrite
from ember.viz.record import Recorder, format_rule_table

FORMAT = "ember-viz"

def viz_target() -> str | None:
  """What VIZ asks for at exit: "serve" (VIZ=1), a file to save the trace to (VIZ=path.json), or None (off)."""
  value = str(VIZ.value)
  if value in ("", "0"): return None
  return "serve" if value == "1" else value

def active() -> Recorder | None:
  """The recorder installed as the rewrite tracer, if any."""
  return rewrite.TRACER if isinstance(rewrite.TRACER, Recorder) else None

@contextlib.contextmanager
def record(graphs: bool = True) -> Iterator[Recorder]:
  """Record every graph_rewrite of the block (the previous recorder, if any, is put back after it), e.g.
  `with ember.viz.record() as rec: (x * 2).realize()`, then `ember.viz.serve(recorder=rec)` or `save(path, rec)`."""
  from ember.profiler import profile
  previous = rewrite.TRACER
  recorder = Recorder(graphs)
  rewrite.TRACER = recorder
  try:
    with profile() as recorder.profile: yield recorder  # the kernels' measured times and the timeline tab
  finally: rewrite.TRACER = previous

def trace(recorder: Recorder | None = None) -> dict[str, Any]:
  """The trace of `recorder` (default: the active one) with every pass's graphs: what `VIZ=file.json` saves."""
  recorder = _recorder(recorder)
  return recorder.export(timeline=profile_events(recorder))

def _recorder(recorder: Recorder | None) -> Recorder:
  if (recorder := recorder or active()) is None:
    raise VizError("nothing is recorded: run with VIZ=1, or inside `with ember.viz.record():`")
  return recorder

def profile_events(recorder: Recorder) -> list[dict[str, Any]]:
  """The Chrome trace events of the profile that ran with `recorder` (the timeline tab; the kernels' times)."""
  return [] if recorder.profile is None else recorder.profile.trace_events()

def save(path: str, recorder: Recorder | None = None) -> None:
  with open(path, "w") as f: json.dump(trace(recorder), f)

def load(path: str) -> dict[str, Any]:
  """A trace saved by VIZ=path.json (or `save`); a VizError when the file is not one."""
  try:
    with open(path) as f: data = json.load(f)
  except json.JSONDecodeError as e:
    raise VizError(f"{path} is not a VIZ trace: not JSON ({e}); save one with VIZ=trace.json python program.py") from e
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise VizError(f"{path} is not a VIZ trace (no \"format\": \"{FORMAT}\" field); save one with VIZ=trace.json "
                   "python program.py")
  return data

def serve(data: dict[str, Any] | None = None, port: int | None = None, recorder: Recorder | None = None) -> None:
  """Serve a saved trace `data`, else what `recorder` (default: the active one) recorded so far, on 127.0.0.1 until
  Ctrl-C; the address is printed. Port: `port`, else VIZ_PORT, else 8000 (any free port when 8000 is taken)."""
  from ember.viz.server import LiveTrace, SavedTrace, make_server, pick_port
  if data is not None: source: SavedTrace | LiveTrace = SavedTrace(data)
  else: source = LiveTrace(recorder := _recorder(recorder), profile_events(recorder))
  server = make_server(source, pick_port(port))
  sys.stderr.write(f"VIZ: serving http://127.0.0.1:{server.server_address[1]} (Ctrl-C to stop)\n")
  try: server.serve_forever()
  except KeyboardInterrupt: sys.stderr.write("VIZ: stopped\n")  # Ctrl-C is how the page is closed
  finally: server.server_close()

def _at_exit(recorder: Recorder) -> None:
  if TRACK_MATCH_STATS.value:
    sys.stderr.write(format_rule_table(recorder.rule_table(every=TRACK_MATCH_STATS.value >= 2)) + "\n")
  if (target := viz_target()) is None: return
  if target == "serve": serve(recorder=recorder)
  else:
    save(target, recorder)
    sys.stderr.write(f"VIZ: trace saved to {os.path.abspath(target)}; view it with python -m ember.viz {target}\n")

def install_from_env() -> None:
  """Called by `import ember` when VIZ or TRACK_MATCH_STATS is set: record from now on, report at exit."""
  recorder = Recorder(graphs=viz_target() is not None)
  rewrite.TRACER = recorder
  if recorder.graphs:  # VIZ times every kernel (ember.profiler) for its kernel list and timeline tab
    from ember.profiler import profile
    recorder.profile = profile().__enter__()
  atexit.register(_at_exit, recorder)
