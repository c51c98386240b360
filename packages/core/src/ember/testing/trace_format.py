"""A strict checker of Chrome's trace-event JSON (the format Perfetto and chrome://tracing load), for the profiler's
tests and the conformance kit.

Written from the format's definition (the "Trace Event Format" document), not from what ember writes: the JSON object
form `{"traceEvents": [...], "displayTimeUnit": "ms"|"ns"}`; complete events (`ph` "X") with a name, a category,
`ts` and `dur` in microseconds (finite, non-negative numbers), integer `pid`/`tid` and an `args` object; metadata
events (`ph` "M") naming processes and threads (`process_name`, `thread_name` with `args.name`, the `*_sort_index`
ones with `args.sort_index`). On top of the format: every complete event's process and thread are named by metadata,
each exactly once, and the complete events of one thread nest (two either do not overlap or one contains the other),
as a viewer draws a thread's slices as a stack.
"""
from __future__ import annotations
import json
import math
from typing import Any

_X_KEYS = {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
_M_KEYS = {"name", "ph", "pid", "tid", "args"}
_M_NAMES = {"process_name": "name", "thread_name": "name", "process_labels": "labels",
            "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}
_M_ARG_TYPES: dict[str, type] = {"name": str, "labels": str, "sort_index": int}
_TOP_KEYS = {"traceEvents", "displayTimeUnit", "otherData", "metadata"}
_NEST_SLACK_US = 1e-3  # float rounding of microsecond times

def _is_int(v: Any) -> bool: return isinstance(v, int) and not isinstance(v, bool)
def _is_time(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

def trace_problems(trace: Any) -> list[str]:
  """Everything wrong with `trace` (the decoded JSON object) as a trace-event file; [] when it is valid."""
  if not isinstance(trace, dict): return [f"the trace is a {type(trace).__name__}, not a JSON object"]
  problems = [f"unknown top-level key {k!r}" for k in trace if k not in _TOP_KEYS]
  if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
    problems.append(f"displayTimeUnit is {trace['displayTimeUnit']!r}, not 'ms' or 'ns'")
  events = trace.get("traceEvents")
  if not isinstance(events, list): return problems + ["traceEvents is missing or not a list"]
  try: roundtrip = json.loads(json.dumps(trace, allow_nan=False))
  except (TypeError, ValueError) as exc: return problems + [f"the trace is not plain JSON: {exc}"]
  if roundtrip != trace: problems.append("the trace changes through a JSON round trip (tuples or non-string keys)")
  process_names: dict[int, str] = {}
  thread_names: dict[tuple[int, int], str] = {}
  tracks: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
  for i, e in enumerate(events):
    where = f"event {i} ({e.get('name')!r})" if isinstance(e, dict) else f"event {i}"
    if not isinstance(e, dict):
      problems.append(f"{where} is not an object")
      continue
    ph = e.get("ph")
    if ph not in ("X", "M"):
      problems.append(f"{where}: ph {ph!r} is neither 'X' (complete) nor 'M' (metadata)")
      continue
    keys = _X_KEYS if ph == "X" else _M_KEYS
    if missing := keys - set(e): problems.append(f"{where}: missing {sorted(missing)}")
    if extra := set(e) - keys: problems.append(f"{where}: unexpected keys {sorted(extra)}")
    if not isinstance(e.get("name"), str) or not e.get("name"): problems.append(f"{where}: name is not a string")
    if not _is_int(e.get("pid")) or not _is_int(e.get("tid")): problems.append(f"{where}: pid/tid are not integers")
    if not isinstance(e.get("args"), dict):
      problems.append(f"{where}: args is not an object")
      continue
    if ph == "M":
      if (arg := _M_NAMES.get(e["name"])) is None:
        problems.append(f"{where}: unknown metadata name {e['name']!r}")
        continue
      if not isinstance(e["args"].get(arg), _M_ARG_TYPES[arg]) or isinstance(e["args"].get(arg), bool):
        problems.append(f"{where}: args.{arg} is not a {_M_ARG_TYPES[arg].__name__}")
        continue
      if e["name"] == "process_name":
        if e["pid"] in process_names: problems.append(f"{where}: pid {e['pid']} is named twice")
        process_names[e["pid"]] = e["args"]["name"]
      elif e["name"] == "thread_name":
        if (e["pid"], e["tid"]) in thread_names: problems.append(f"{where}: pid/tid {e['pid']}/{e['tid']} named twice")
        thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
      continue
    if not isinstance(e.get("cat"), str): problems.append(f"{where}: cat is not a string")
    if not _is_time(e.get("ts")) or not _is_time(e.get("dur")):
      problems.append(f"{where}: ts {e.get('ts')!r} / dur {e.get('dur')!r} are not finite non-negative numbers")
      continue
    tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
  for pid, tid in tracks:
    if pid not in process_names: problems.append(f"pid {pid} has complete events but no process_name metadata")
    if (pid, tid) not in thread_names: problems.append(f"pid {pid} tid {tid} has complete events but no thread_name")
  for track, spans in tracks.items():
    open_spans: list[tuple[float, float, str]] = []
    for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
      while open_spans and open_spans[-1][1] <= start + _NEST_SLACK_US: open_spans.pop()
      if open_spans and end > open_spans[-1][1] + _NEST_SLACK_US:
        problems.append(f"pid/tid {track}: {name!r} [{start}, {end}] overlaps {open_spans[-1][2]!r} "
                        f"[{open_spans[-1][0]}, {open_spans[-1][1]}] without nesting in it")
      open_spans.append((start, end, name))
  return problems

def assert_valid_trace(trace: Any) -> None:
  """Raise AssertionError listing what is wrong with `trace` as a trace-event file."""
  if problems := trace_problems(trace):
    raise AssertionError("invalid trace-event JSON:\n  " + "\n  ".join(problems[:20]))

__all__ = ["trace_problems", "assert_valid_trace"]
