"""compare: what differs between two capture folders, as text with unified diffs.

Kernels are matched by AST key. A kernel in both captures whose program text changed for a renderer is reported with
the diff; a kernel in one capture only is added or removed, and the kernels a workload schedules on one side only are
diffed in pairs, in schedule order (AST and every renderer's program). Renderers captured on one side only, renderers
whose build failed differently, and workloads that raise on one side or schedule other kernels are differences too.
"""
from __future__ import annotations
import difflib
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO
from .record import FORMAT, MANIFEST, renderer_dir
from .errors import CaptureNotFoundError, ReplayError

@dataclass
class Capture:
  path: str
  manifest: dict[str, Any]
  def text(self, kind: str, key: str) -> str:
    with open(os.path.join(self.path, kind, f"{key}.txt"), encoding="utf-8") as f: return f.read()
  def source(self, label: str, key: str) -> str: return self.text(renderer_dir(label), key)
  def describe(self, key: str) -> str:
    k = self.manifest["kernels"][key]
    first = next((w for w, info in self.manifest["workloads"].items() if key in info["kernels"]), "?")
    return f"{k['name']} [{key}] (first in {first})"

def load(path: str) -> Capture:
  manifest_path = os.path.join(path, MANIFEST)
  if not os.path.isfile(manifest_path):
    raise CaptureNotFoundError(f"{path} holds no {MANIFEST}: make a capture first with "
                               f"`python -m ember.replay capture {path}`")
  with open(manifest_path, encoding="utf-8") as f: manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise ReplayError(f"{path} is a capture of format {manifest.get('format')!r}, this tool reads format {FORMAT}; "
                      "capture both sides with the same tool")
  return Capture(path, manifest)

@dataclass
class Report:
  """The differences, in the order they are printed; `diffs` counts the unified diffs printed in full."""
  out: TextIO
  max_diffs: int
  count: int = 0
  diffs: int = 0
  def difference(self, line: str) -> None:
    self.count += 1
    self.out.write(line + "\n")
  def diff(self, a: str, b: str, name_a: str, name_b: str) -> None:
    if self.diffs >= self.max_diffs: return
    self.diffs += 1
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, lineterm=""):
      self.out.write(line + "\n")

def _compare_settings(a: Capture, b: Capture, report: Report) -> None:
  if a.manifest["settings"] != b.manifest["settings"]:
    report.difference(f"capture settings differ: {a.manifest['settings']} vs {b.manifest['settings']}")

def _compare_renderers(a: Capture, b: Capture, report: Report) -> list[str]:
  """Report renderers on one side only or built differently; return the labels both sides rendered."""
  ra, rb = a.manifest["renderers"], b.manifest["renderers"]
  for label in sorted(set(ra) | set(rb)):
    if label not in rb: report.difference(f"renderer {label} ({ra[label]}): only in {a.path}")
    elif label not in ra: report.difference(f"renderer {label} ({rb[label]}): only in {b.path}")
    elif ra[label] != rb[label]: report.difference(f"renderer {label}: {ra[label]} vs {rb[label]}")
  aa, ab = a.manifest["aliases"], b.manifest["aliases"]
  for label in sorted(set(aa) | set(ab)):
    if aa.get(label) != ab.get(label):
      report.difference(f"renderer {label} rendered as: {aa.get(label, label)} vs {ab.get(label, label)}")
  ua, ub = a.manifest["unavailable"], b.manifest["unavailable"]
  for label in sorted(set(ua) | set(ub)):
    if ua.get(label) != ub.get(label):
      report.difference(f"renderer {label} unavailable: {ua.get(label, '(available)')} vs "
                        f"{ub.get(label, '(available)')}")
  return [label for label in ra if label in rb]

def _compare_workloads(a: Capture, b: Capture, report: Report) -> list[tuple[str, str]]:
  """Report workloads on one side only, raising differently or scheduling other kernels; return the kernels a
  workload schedules on one side only, paired in schedule order (key in a, key in b), for diffing."""
  wa, wb = a.manifest["workloads"], b.manifest["workloads"]
  pairs: list[tuple[str, str]] = []
  for name in list(wa) + [n for n in wb if n not in wa]:
    if name not in wb or name not in wa:
      report.difference(f"workload {name}: only in {a.path if name in wa else b.path}")
      continue
    if wa[name]["error"] != wb[name]["error"]:
      report.difference(f"workload {name} error: {wa[name]['error']} vs {wb[name]['error']}")
    # the same kernels in another order is no difference: the order of independent kernels in a schedule can vary
    # between processes (tensors collected from a weak set, ordered by address)
    ka, kb = Counter(wa[name]["kernels"]), Counter(wb[name]["kernels"])
    if ka != kb:
      gone, new = ka - kb, kb - ka
      report.difference(f"workload {name}: {gone.total()} of its {ka.total()} kernels in {a.path} are not in "
                        f"{b.path}, {new.total()} of its {kb.total()} kernels there are new")
      pairs += list(zip(gone, new))  # in schedule order on each side
  return pairs

def compare(path_a: str, path_b: str, out: TextIO, max_diffs: int = 50) -> int:
  """Print every difference between captures `path_a` and `path_b` to `out` (at most `max_diffs` unified diffs in
  full, the rest by name); returns how many differences there are (0: identical)."""
  a, b = load(path_a), load(path_b)
  report = Report(out, max_diffs)
  _compare_settings(a, b, report)
  labels = _compare_renderers(a, b, report)
  pairs = _compare_workloads(a, b, report)
  ka, kb = a.manifest["kernels"], b.manifest["kernels"]
  changed = 0
  for key in ka:
    if key not in kb: continue
    for label in labels:
      src_a, src_b = a.source(label, key), b.source(label, key)
      if src_a == src_b: continue
      changed += 1
      report.difference(f"changed {label}: {a.describe(key)}")
      report.diff(src_a, src_b, f"{path_a}/{label}/{key}", f"{path_b}/{label}/{key}")
  removed, added = [k for k in ka if k not in kb], [k for k in kb if k not in ka]
  for key in removed: report.difference(f"removed: {a.describe(key)}")
  for key in added: report.difference(f"added: {b.describe(key)}")
  paired: set[tuple[str, str]] = set()
  for key_a, key_b in pairs:
    if key_a in kb or key_b in ka or (key_a, key_b) in paired: continue
    paired.add((key_a, key_b))
    out.write(f"--- the AST of {a.describe(key_a)} became {b.describe(key_b)}\n")
    report.diff(a.text("ast", key_a), b.text("ast", key_b), f"{path_a}/ast/{key_a}", f"{path_b}/ast/{key_b}")
    for label in labels:
      report.diff(a.source(label, key_a), b.source(label, key_b), f"{path_a}/{label}/{key_a}",
                  f"{path_b}/{label}/{key_b}")
  out.write(f"{len(ka)} kernels in {path_a}, {len(kb)} in {path_b}, {len(labels)} renderers compared: {changed} "
            f"programs changed, {len(added)} kernels added, {len(removed)} removed; {report.count} differences"
            + (f" ({report.diffs} diffs shown, --max-diffs {max_diffs})" if report.diffs >= max_diffs else "") + "\n")
  return report.count
