"""capture: run the corpus on NULL, then render every kernel it scheduled with every renderer the registry offers.

A capture folder holds ``manifest.json`` (the renderers, the workloads and the kernels each scheduled, the
renderers that could not be built and why), ``ast/<key>.txt`` (each kernel's AST as text; the key is a hash of it)
and ``<DEVICE>-<RENDERER>/<key>.txt`` (each kernel's programs for that renderer: a header line per program with its
name and launch sizes, then its source; a kernel the renderer rejects holds the error instead).
"""
from __future__ import annotations
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from typing import Any
from .corpus import WORKLOADS
from .errors import ReplayError
from . import pipeline

FORMAT = 1
MANIFEST = "manifest.json"
# the renderers the corpus is meant for, by the DEV string that selects each: one that no loaded backend registers
# is recorded as absent (its package is not installed), not as an error
TARGETS = ("CPU:C", "CPU:LLVM", "CUDA:CUDA", "CUDA:PTX", "AMD:HIP", "AMD:LLVM", "METAL:MSL", "PYTHON:PYTHON")

# ** the AST key **

_address = re.compile(r" at 0x[0-9a-fA-F]+")

def ast_text(ast: Any) -> str:
  """The kernel AST as lines `n op dtype (sources) arg tag`, nodes numbered in toposort order: the same text for the
  same graph in any process (no ids, no addresses)."""
  index: dict[Any, int] = {}
  lines = []
  for i, u in enumerate(ast.toposort()):
    index[u] = i
    srcs = ", ".join(str(index[s]) for s in u.src)
    tag = "" if u.tag is None else f" tag={u.tag!r}"
    lines.append(_address.sub("", f"{i} {u.op!r} {u.dtype!r} ({srcs}) arg={u.arg!r}{tag}"))
  return "\n".join(lines) + "\n"

def ast_key(text: str) -> str: return hashlib.sha256(text.encode()).hexdigest()[:20]

def renderer_dir(label: str) -> str: return label.replace(":", "-")

# ** running the corpus **

@dataclass
class Kernel:
  key: str
  ast: Any
  text: str
  nbufs: int
  device: str
  name: str

@dataclass
class Corpus:
  """What the workloads scheduled: every distinct kernel by key, in order of first appearance, and per workload the
  keys of its kernels in schedule order (repeats included) or the error it raised."""
  kernels: dict[str, Kernel] = field(default_factory=dict)
  workloads: dict[str, dict[str, Any]] = field(default_factory=dict)

def select(patterns: list[str] | None) -> list[str]:
  """The workload names matching any of `patterns` (fnmatch, e.g. ``bench/*``, ``api/matmul``); all when None."""
  if not patterns: return list(WORKLOADS)
  names = [n for n in WORKLOADS if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
  if not names:
    raise ReplayError(f"no workload matches {', '.join(patterns)}; list them with `python -m ember.replay list`")
  return names

def run_corpus(names: list[str]) -> Corpus:
  """Run each workload on its device (NULL or PYTHON), each from seed 0, and collect its kernels. A workload that
  raises is recorded with its error (compare reports it), and the rest still run."""
  corpus = Corpus()
  for name in names:
    workload = WORKLOADS[name]
    scheduled: list[tuple[Any, int, str]] = []
    error = None
    with pipeline.settings(), pipeline.default_device(workload.device):
      pipeline.seed(0)  # outside the recording: reseeding is no kernel of the workload's
      with pipeline.recording(scheduled):
        try: workload.run()
        except Exception as e:  # noqa: BLE001  recorded in the manifest and reported by compare, never dropped
          error = f"{type(e).__name__}: {_address.sub('', str(e))}"
    keys = []
    for ast, nbufs, device in scheduled:
      text = ast_text(ast)
      key = ast_key(text)
      if key not in corpus.kernels:
        corpus.kernels[key] = Kernel(key, ast, text, nbufs, device, pipeline.kernel_name(ast))
      keys.append(key)
    corpus.workloads[name] = {"device": workload.device, "kernels": keys, "error": error}
  if not corpus.kernels and all(w["error"] is None for w in corpus.workloads.values()):
    raise ReplayError(f"workloads {', '.join(names)} ran but no schedule reached the recorder: the pipeline no longer "
                      "runs schedules where ember/replay/pipeline.py `recording` listens; update it")
  return corpus

# ** rendering **

def renderers() -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
  """Every renderer the loaded backends register, built for its default arch, by `DEVICE:NAME`; the labels of
  renderers another device registers too (NV's CUDA is CUDA's), each mapped to the label it is rendered under (the
  device of higher priority); and the renderers that could not be built or are absent, with the reason."""
  reg = pipeline.registry()
  built: dict[str, Any] = {}
  first: dict[str, str] = {}  # repr of a renderer -> the label it is rendered under
  aliases: dict[str, str] = {}
  unavailable: dict[str, str] = {}
  def priority(device: str) -> int: return max((d.priority for d in reg.devices.get(device, [])), default=-1)
  with pipeline.settings():
    for device in sorted(reg.renderers, key=lambda d: (-priority(d), d)):
      for entry in reg.renderers[device]:
        label = f"{device}:{entry.name}"
        try: renderer = entry.factory("")
        except Exception as e:  # noqa: BLE001  e.g. a renderer that needs an arch: recorded, compared like a kernel
          unavailable[label] = f"{type(e).__name__}: {e}"
          continue
        if repr(renderer) in first: aliases[label] = first[repr(renderer)]
        else: built[label], first[repr(renderer)] = renderer, label
  failed = {r.name: r for r in reg.backends if r.status != "ok"}
  for label in TARGETS:
    if label in built or label in aliases or label in unavailable: continue
    backend = failed.get(label.split(":")[0].lower())
    unavailable[label] = (f"absent: backend {backend.name} is {backend.status}: {backend.reason}" if backend is not None
                          else "absent: no loaded backend registers it (its package is not installed)")
  return built, aliases, unavailable

def render(kernel: Kernel, renderer: Any, device: str) -> str:
  """The kernel's programs for `renderer`, or the error the renderer raised on it (an outcome worth comparing)."""
  with pipeline.settings():
    try: progs = pipeline.programs(kernel.ast, kernel.nbufs, renderer, device)
    except Exception as e:  # noqa: BLE001  a renderer's refusal is part of what replay compares
      return f"error: {type(e).__name__}: {_address.sub('', str(e))}\n"
  out = []
  for i, p in enumerate(progs):
    out.append(f"=== program {i + 1}/{len(progs)} {p.name} global={p.global_size} local={p.local_size}\n")
    out.append(p.src if p.src.endswith("\n") else p.src + "\n")
  return "".join(out)

# ** the capture folder **

def _prepare(out: str) -> None:
  if os.path.isdir(out) and os.listdir(out):
    if not os.path.exists(os.path.join(out, MANIFEST)):
      raise ReplayError(f"{out} is not empty and holds no {MANIFEST}: capture writes into an empty or new folder, or "
                        "over an earlier capture")
    shutil.rmtree(out)
  os.makedirs(out, exist_ok=True)

def _write(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8", newline="\n") as f: f.write(text)

def capture(out: str, patterns: list[str] | None = None) -> dict[str, Any]:
  """Run the corpus (the workloads matching `patterns`, default all) and write the capture folder `out`; returns the
  manifest."""
  names = select(patterns)
  _prepare(out)
  corpus = run_corpus(names)
  built, aliases, unavailable = renderers()
  for key, kernel in corpus.kernels.items():
    _write(os.path.join(out, "ast", f"{key}.txt"), kernel.text)
    for label, renderer in built.items():
      _write(os.path.join(out, renderer_dir(label), f"{key}.txt"), render(kernel, renderer, label.split(":")[0]))
  manifest = {
    "format": FORMAT, "ember": pipeline.ember_version(), "settings": pipeline.SETTINGS,
    "renderers": {label: repr(r) for label, r in built.items()}, "aliases": aliases, "unavailable": unavailable,
    "workloads": corpus.workloads,
    "kernels": {k: {"name": kn.name, "nbufs": kn.nbufs, "device": kn.device} for k, kn in corpus.kernels.items()},
  }
  _write(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n")
  return manifest

# ** capturing another tree **

def tree_paths(tree: str) -> tuple[list[str], list[str]]:
  """The source folders of every package of checkout `tree` (its packages/*/src) and its backends' entry points as
  ``name=module`` (from each package's pyproject.toml), so a process can run that tree's code without installing it."""
  packages = os.path.join(tree, "packages")
  if not os.path.isfile(os.path.join(packages, "core", "src", "ember", "__init__.py")):
    raise ReplayError(f"{tree} is not an ember checkout: {packages}/core/src/ember/__init__.py is missing")
  paths, plugins = [], []
  for name in sorted(os.listdir(packages)):
    src = os.path.join(packages, name, "src")
    if not os.path.isdir(src): continue
    paths.append(src)
    pyproject = os.path.join(packages, name, "pyproject.toml")
    if os.path.exists(pyproject):
      with open(pyproject, "rb") as f: project = tomllib.load(f).get("project", {})
      backends = project.get("entry-points", {}).get("ember.backends", {})
      plugins += [f"{backend}={module}" for backend, module in sorted(backends.items())]
  return paths, plugins

def capture_tree(tree: str, out: str, patterns: list[str] | None = None) -> int:
  """Capture with the code of checkout `tree` in a child process: this driver is copied out as its own top-level
  package, and the child imports ember and every backend from `tree`'s sources (backends through EMBER_PLUGINS, so
  nothing needs installing). Returns the child's exit status."""
  paths, plugins = tree_paths(os.path.abspath(tree))
  with tempfile.TemporaryDirectory(prefix="ember-replay-") as tmp:
    driver = "_ember_replay_driver"
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copytree(here, os.path.join(tmp, driver), ignore=shutil.ignore_patterns("__pycache__"))
    # every backend of the tree, each loaded or recorded with the reason it is not (never strict: a broken backend is
    # one more outcome to compare), on the device each workload asks for
    dropped = ("DEV", "EMBER_BACKENDS", "EMBER_DISABLE_BACKENDS", "EMBER_STRICT_BACKENDS")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join([tmp, *paths])
    env["EMBER_PLUGINS"] = ",".join(plugins)
    core = os.path.join(os.path.abspath(tree), "packages", "core", "src")
    args = [sys.executable, "-m", driver, "capture", os.path.abspath(out), "--expect-ember", core]
    for p in patterns or []: args += ["--only", p]
    return subprocess.run(args, env=env, check=False).returncode
