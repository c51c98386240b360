"""The recorder behind VIZ and TRACK_MATCH_STATS.

Installed as `ember.uop.rewrite.TRACER`, it sees every `graph_rewrite` call: the pass name, the kernel being compiled
(codegen's `get_program` opens and closes a kernel), the graph it started from and, for each rule that fired, the
node it matched and the node it returned. Rules are named by their callback and located by the line their pattern is
written on (`UPat.location`). It keeps only references to hash-consed UOps while the program runs; the graphs after
each step are rebuilt by substitution when the trace is exported (`Recorder.export`), so recording stays cheap.

With `graphs=False` (TRACK_MATCH_STATS alone) it keeps only the per-rule counts and times.
"""
from __future__ import annotations
import linecache
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from ember.dtype import PtrDType
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import PatternMatcher, RewriteFn, UPat, rewrite_walk

MAX_STEPS = 2000  # rewrite steps per pass whose graphs an export rebuilds (every match is still counted)
MAX_ARG_CHARS = 60

RuleKey = tuple[UPat, RewriteFn]

@dataclass
class RuleStats:
  """One rule: how often it was tried on a node, how often it returned a replacement, and the seconds both took."""
  name: str
  location: str
  comment: str
  tries: int = 0
  matches: int = 0
  seconds: float = 0.0

@dataclass
class RewriteRecord:
  """One graph_rewrite call (or a graph snapshot, with no steps): `steps` are (rule, matched node, replacement)."""
  name: str
  sink: UOp
  result: UOp
  steps: list[tuple[RuleKey, UOp, UOp]] = field(default_factory=list)
  matches: int = 0
  seconds: float = 0.0
  tensor_level: bool = False  # a tensor graph: its nodes have shapes

@dataclass
class KernelRecord:
  """A kernel's codegen (kind "kernel"), or the rewrites that ran outside any kernel ("schedule", "other")."""
  name: str
  kind: str
  device: str = ""
  ast: UOp | None = None
  opts: list[str] = field(default_factory=list)
  uops: list[UOp] = field(default_factory=list)
  src: str = ""
  rewrites: list[RewriteRecord] = field(default_factory=list)

def short_path(path: str) -> str:
  """`path` relative to the sys.path entry holding it (`ember/uop/symbolic.py`), else as given."""
  roots = [p for p in sys.path if p and path.startswith(os.path.join(p, ""))]
  return os.path.relpath(path, max(roots, key=len)) if roots else path

def _comment(line: str) -> str:
  return line.rsplit("# ", 1)[1].strip() if "# " in line else ""

def rule_stats(key: RuleKey) -> RuleStats:
  """A fresh RuleStats named after the callback (a lambda by the rule's trailing comment, else its source text)."""
  pat, fn = key
  filename, line = pat.location
  text = linecache.getline(filename, line).strip()
  name = getattr(fn, "__name__", type(fn).__name__)
  code = getattr(fn, "__code__", None)
  fn_text = linecache.getline(code.co_filename, code.co_firstlineno).strip() if code is not None else ""
  comment = _comment(text) or _comment(fn_text)
  if name == "<lambda>" and comment: name = comment  # the algebra, `x+0 -> x`
  elif name == "<lambda>" and "lambda" in fn_text:
    body = fn_text[fn_text.index("lambda"):].split("  # ")[0].rstrip("),")
    name = body if len(body) <= 60 else body[:57] + "..."
  return RuleStats(name, f"{short_path(filename)}:{line}", comment)

def dtype_text(dtype: Any) -> str:
  if isinstance(dtype, PtrDType): return f"{dtype.base.name}*"
  return getattr(dtype, "name", str(dtype))

def arg_text(arg: Any) -> str:
  text = "" if arg is None else str(arg)
  return text if len(text) <= MAX_ARG_CHARS else text[:MAX_ARG_CHARS - 3] + "..."

def format_graph(sink: UOp) -> str:
  """A graph as numbered lines, sources first: `x3 = ADD float (x1, x2) arg`."""
  names = {node: f"x{i}" for i, node in enumerate(sink.toposort())}
  lines = []
  for node, name in names.items():
    srcs = ", ".join(names[s] for s in node.src)
    lines.append(f"{name} = {node.op.name} {dtype_text(node.dtype)} ({srcs}) {arg_text(node.arg)}".rstrip())
  return "\n".join(lines)

def format_program(uops: list[UOp]) -> str:
  """A linear program one uop a line, indented by loop depth: `  4 RANGE int (3) (0, AxisType.GLOBAL)`."""
  index = {u: i for i, u in enumerate(uops)}
  lines, depth = [], 0
  for i, u in enumerate(uops):
    if u.op is Ops.END: depth = max(depth - 1, 0)
    srcs = ", ".join(str(index[s]) if s in index else s.op.name for s in u.src)
    lines.append(f"{i:4d} {'  ' * depth}{u.op.name} {dtype_text(u.dtype)} ({srcs}) {arg_text(u.arg)}".rstrip())
    if u.op is Ops.RANGE: depth += 1
  return "\n".join(lines)

class Recorder:
  """The rewrite tracer: `graphs` keeps every pass's graphs and steps (VIZ), the rule stats are always kept."""
  def __init__(self, graphs: bool = True):
    self.graphs = graphs
    self.kernels: list[KernelRecord] = []
    self.rules: dict[RuleKey, RuleStats] = {}
    self.current: KernelRecord | None = None
    self.outside: KernelRecord | None = None  # the running group of rewrites outside codegen
    self.profile: Any = None  # the ember.profiler Profile that times the kernels while VIZ records

  def _group(self) -> KernelRecord:
    if self.current is not None: return self.current
    if self.outside is None:
      self.outside = KernelRecord("outside kernels", "other")
      self.kernels.append(self.outside)
    return self.outside

  # ** the tracer protocol (ember.uop.rewrite.RewriteTracer) **
  def graph_rewrite(self, sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None) -> UOp:
    record = RewriteRecord(name or "unnamed rewrite", sink, sink)
    rules = self.rules
    def on_try(pat: UPat, fn: RewriteFn, node: UOp, replacement: UOp | None, seconds: float) -> None:
      if (stats := rules.get((pat, fn))) is None: stats = rules[(pat, fn)] = rule_stats((pat, fn))
      stats.tries += 1
      stats.seconds += seconds
      if replacement is None: return
      stats.matches += 1
      record.matches += 1
      if self.graphs and len(record.steps) < MAX_STEPS: record.steps.append(((pat, fn), node, replacement))
    def traced(node: UOp, ctx: Any) -> UOp | None: return pm.traced_rewrite(node, ctx, on_try)
    start = time.perf_counter()
    record.result = rewrite_walk(sink, traced, ctx, bottom_up, name)
    record.seconds = time.perf_counter() - start
    # a kernel lists every pass codegen ran; outside kernels (the tensor code's shape simplifications, the
    # scheduler's) only the passes that rewrote something, or a long program's trace fills with no-ops
    if self.graphs and (self.current is not None or record.matches): self._group().rewrites.append(record)
    return record.result

  def record_graph(self, name: str, sink: UOp) -> None:
    """A snapshot of a graph no rewrite produced (the scheduler's tensor graph), shown as a pass without steps."""
    if not self.graphs: return
    group = KernelRecord("schedule", "schedule")
    group.rewrites.append(RewriteRecord(name, sink, sink, tensor_level=True))
    self.kernels.append(group)
    self.outside = group  # the rewrites scheduling runs outside codegen are the schedule's

  def begin_kernel(self, ast: UOp, device: str) -> None:
    if not self.graphs: return
    self.current = KernelRecord("kernel", "kernel", device, ast)
    self.current.rewrites.append(RewriteRecord("kernel AST", ast, ast))
    self.kernels.append(self.current)

  def note_opts(self, opts: list[Any]) -> None:
    if self.current is not None: self.current.opts = [str(o) for o in opts]

  def end_kernel(self, spec: Any) -> None:
    if self.current is None: return
    self.current.name, self.current.uops, self.current.src = spec.name, list(spec.uops), spec.src
    self.current = None
    self.outside = None

  # ** reading it **
  def rule_table(self, every: bool = False) -> list[RuleStats]:
    """The rules that matched (`every`: also those only tried), most time first."""
    rows = [r for r in self.rules.values() if every or r.matches]
    return sorted(rows, key=lambda r: (-r.seconds, -r.matches, r.location))

  def export(self, details: bool = True, timeline: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The trace as JSON-ready data: what the web UI shows and `VIZ=file.json` saves. Without `details` the passes
    carry only their counts (the server rebuilds a pass's graphs when the page asks for it: `export_rewrite`).
    `timeline`: the profiler's Chrome trace events; its kernel events give each kernel its measured time."""
    times: dict[tuple[str, str], list[float]] = {}
    devices = {e["pid"]: e["args"]["name"] for e in timeline or () if e["ph"] == "M" and e["name"] == "process_name"}
    for e in timeline or ():
      if e["ph"] == "X" and e.get("cat") == "kernel":
        entry = times.setdefault((e["name"], devices.get(e["pid"], "")), [0.0, 0])
        entry[0], entry[1] = entry[0] + e["dur"] / 1e6, entry[1] + 1
    kernels = []
    for kernel in self.kernels:
      passes = [{**pass_summary(r), **(self.export_rewrite(r) if details else {})} for r in kernel.rewrites]
      seconds, runs = times.get((kernel.name, kernel.device), (None, 0))
      kernels.append({
        "name": kernel.name, "kind": kernel.kind, "device": kernel.device, "opts": kernel.opts,
        "ast": format_graph(kernel.ast) if kernel.ast is not None else "",
        "program": format_program(kernel.uops), "source": kernel.src, "time_s": seconds, "runs": runs,
        "rewrites": passes})
    rules = [{"name": s.name, "location": s.location, "comment": s.comment, "tries": s.tries, "matches": s.matches,
              "seconds": s.seconds} for s in self.rules.values()]
    return {"format": "ember-viz", "version": 1, "kernels": kernels, "rules": rules, "timeline": timeline or []}

  def export_rewrite(self, record: RewriteRecord) -> dict[str, Any]:
    """A pass with the graph after each step: the graph so far with the matched node substituted by its replacement
    (hash-consing makes the walk's rebuilt nodes the same objects, so this ends at the walk's result). A step whose
    node is not in the graph (a rule fired on an intermediate node the walk dropped) keeps the graph as it was."""
    rule_ids = {key: i for i, key in enumerate(self.rules)}
    table = NodeTable(record.tensor_level)
    graph, nodes = record.sink, record.sink.toposort()
    steps: list[dict[str, Any]] = [{"sink": table.add(nodes), "rule": None, "match": None, "replacement": None,
                                    "nodes": len(nodes)}]
    for key, node, replacement in record.steps:
      if node in nodes:
        graph = graph.substitute({node: replacement})
        nodes = graph.toposort()
      steps.append({"sink": table.add(nodes), "rule": rule_ids[key], "match": table.ids.get(node),
                    "replacement": table.add(replacement.toposort()), "nodes": len(nodes)})
    return {"nodes": table.nodes, "steps": steps}

def pass_summary(record: RewriteRecord) -> dict[str, Any]:
  return {"name": record.name, "matches": record.matches, "seconds": record.seconds, "steps": len(record.steps),
          "nodes_before": len(record.sink.toposort()), "nodes_after": len(record.result.toposort()),
          "truncated": record.matches > len(record.steps)}

class NodeTable:
  """UOps as numbered JSON nodes, each added once: a step's graph is the nodes reachable from its sink's id."""
  def __init__(self, tensor_level: bool):
    self.ids: dict[UOp, int] = {}
    self.nodes: list[dict[str, Any]] = []
    self.tensor_level = tensor_level
  def add(self, toposorted: dict[UOp, None]) -> int:
    """Add a graph given as its toposort (sources first, the sink last); the sink's id."""
    for node in toposorted:
      if node in self.ids: continue
      entry: dict[str, Any] = {"op": node.op.name, "dtype": dtype_text(node.dtype), "arg": arg_text(node.arg),
                               "src": [self.ids[s] for s in node.src]}
      if self.tensor_level and node.op is not Ops.SINK: entry["shape"] = shape_text(node.shape)
      self.ids[node] = len(self.nodes)
      self.nodes.append(entry)
    return self.ids[next(reversed(toposorted))]

def shape_text(shape: tuple[Any, ...]) -> str:
  return "(" + ", ".join(s.render() if isinstance(s, UOp) else str(s) for s in shape) + ")"

def format_rule_table(rows: list[RuleStats]) -> str:
  """TRACK_MATCH_STATS' table: one rule a line, most time first."""
  total_s = sum(r.seconds for r in rows)
  lines = [f"TRACK_MATCH_STATS: {len(rows)} rules, {sum(r.matches for r in rows)} matches in "
           f"{sum(r.tries for r in rows)} tries, {total_s * 1e3:.2f} ms matching",
           f"{'matches':>8s} {'tries':>9s} {'ms':>9s}  {'rule':48s} location"]
  for r in rows:
    lines.append(f"{r.matches:8d} {r.tries:9d} {r.seconds * 1e3:9.3f}  {r.name[:48]:48s} {r.location}")
  return "\n".join(lines)
