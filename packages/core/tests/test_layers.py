"""The layer order of ember-core (ARCHITECTURE.md, "Layers"): a module imports, at module level, only modules of its
own layer or a lower one, and no module-level import circle exists between core modules. Imports inside functions
and under `if TYPE_CHECKING:` are not checked (they are how a lower layer reaches a higher one lazily)."""
from __future__ import annotations
import ast
from pathlib import Path
import pytest
import ember

SRC = Path(ember.__file__).resolve().parent

# lowest first; a module's layer is the longest prefix listed here
LAYERS: list[tuple[str, ...]] = [
  ("ember.errors", "ember.helpers", "ember.dtype", "ember.profiler"),
  ("ember.uop",),
  ("ember.renderer",),
  ("ember.codegen",),
  ("ember.device",),
  ("ember.schedule",),
  ("ember.engine",),
  ("ember.gradient", "ember.tensor_index", "ember.tensor", "ember.tensor_ops", "ember.function"),
  ("ember.multi", "ember.distributed"),
  ("ember.plugin",),
  ("ember.testing", "ember.replay", "ember.__main__", "ember"),
]

def layer_of(module: str) -> int:
  best, found = -1, -1
  for i, prefixes in enumerate(LAYERS):
    for p in prefixes:
      if (module == p or module.startswith(p + ".")) and len(p) > best: best, found = len(p), i
  if found < 0: raise AssertionError(f"{module} is in no layer: add it to LAYERS and to ARCHITECTURE.md")
  return found

def module_name(path: Path, root: Path) -> str:
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  if parts[-1] == "__init__": parts.pop()
  return ".".join(parts)

def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
         (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")

def module_level_imports(source: str, module: str, is_package: bool) -> set[str]:
  """The ember modules `source` imports when it is imported (top level, and inside top-level if/try/with blocks)."""
  found: set[str] = set()
  def visit(body: list[ast.stmt]) -> None:
    for node in body:
      if isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name == "ember" or a.name.startswith("ember."))
      elif isinstance(node, ast.ImportFrom):
        if node.level:
          base = module.split(".") if is_package else module.split(".")[:-1]
          base = base[:len(base) - (node.level - 1)]
          target = ".".join(base + ([node.module] if node.module else []))
        else: target = node.module or ""
        if target == "ember" or target.startswith("ember."):
          # `from ember.x import y` may import the submodule ember.x.y
          found.update({target} | {f"{target}.{a.name}" for a in node.names})
      elif isinstance(node, ast.If) and not _is_type_checking(node.test): visit(node.body + node.orelse)
      elif isinstance(node, ast.Try): visit(node.body + node.orelse + node.finalbody)
      elif isinstance(node, ast.With): visit(node.body)
  visit(ast.parse(source).body)
  return found

def core_modules(root: Path) -> dict[str, Path]:
  mods = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
  if not mods: raise AssertionError(f"no modules found under {root}: the layer test checked nothing")
  return mods

def import_graph(root: Path) -> dict[str, set[str]]:
  mods = core_modules(root)
  graph = {}
  for name, path in mods.items():
    deps = module_level_imports(path.read_text(), name, path.name == "__init__.py")
    graph[name] = {d for d in deps if d in mods and d != name}
  return graph

def layer_violations(graph: dict[str, set[str]]) -> list[str]:
  return sorted(f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
                for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m))

def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  cycles: list[list[str]] = []
  def strongconnect(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        strongconnect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v: break
      if len(comp) > 1: cycles.append(sorted(comp))
  for v in sorted(graph):
    if v not in index: strongconnect(v)
  return sorted(cycles)

# package __init__ files import their own submodules to re-export them; that is not a circle through the package's
# users, so a package's edge to its own submodules is left out of the cycle check
def _without_package_reexports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}

def test_core_respects_its_layer_order() -> None:
  assert layer_violations(import_graph(SRC)) == []

def test_core_has_no_module_level_import_circle() -> None:
  assert import_cycles(_without_package_reexports(import_graph(SRC))) == []

# ** the checkers themselves catch what they are for (a test that cannot fail tests nothing) **

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
  root = tmp_path / "ember"
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return root

def test_checker_flags_an_import_from_a_higher_layer(tmp_path: Path) -> None:
  root = _tree(tmp_path, {"__init__.py": "", "uop/__init__.py": "", "uop/ops.py": "from ember.tensor import Tensor\n",
                          "tensor.py": "def f():\n  from ember.engine import jit\n",
                          "engine/__init__.py": "", "engine/jit.py": "from ..uop import ops\n"})
  assert layer_violations(import_graph(root)) == ["ember.uop.ops (layer 1) imports ember.tensor (layer 7)"]

def test_checker_flags_a_circle(tmp_path: Path) -> None:
  root = _tree(tmp_path, {"__init__.py": "", "device/__init__.py": "", "plugin.py": "import ember.device.base\n",
                          "device/base.py": "if True:\n  from ember.plugin import hookimpl\n",
                          "tensor.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import ember.multi\n",
                          "multi.py": "import ember.tensor\n"})
  assert import_cycles(import_graph(root)) == [["ember.device.base", "ember.plugin"]]

def test_checker_fails_on_an_empty_tree(tmp_path: Path) -> None:
  (tmp_path / "ember").mkdir()
  with pytest.raises(AssertionError, match="checked nothing"): import_graph(tmp_path / "ember")
