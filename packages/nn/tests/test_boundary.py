"""The import boundary (docs/public-api.md): ember-nn and every backend use only core's public API: the names in
`ember.__all__` (and `ember.nn`), `ember.errors.__all__`, `ember.dtype.__all__` and `ember.plugin.__all__`.

The sources are found both in this checkout and where Python imports the packages from (an editable install, or
installed wheels with no source tree), and the test fails, rather than passing with nothing checked, when it finds no
file to check."""
from __future__ import annotations
import ast
import importlib.metadata
import importlib.util
from pathlib import Path
import pytest
import ember
import ember.dtype
import ember.errors
import ember.plugin

NN_CHECKOUT = Path(__file__).resolve().parents[1] / "src" / "ember" / "nn"
REPO = Path(__file__).resolve().parents[3]
PUBLIC_MODULES = ("errors", "dtype", "plugin", "nn")

def public_names() -> dict[str, frozenset[str]]:
  """Public module -> the names a package outside core may import from it."""
  return {"ember": frozenset(ember.__all__) | frozenset(PUBLIC_MODULES),
          "ember.errors": frozenset(ember.errors.__all__), "ember.dtype": frozenset(ember.dtype.__all__),
          "ember.plugin": frozenset(ember.plugin.__all__)}

def _core(module: str) -> bool: return module == "ember" or module.startswith("ember.")
def _own(module: str) -> bool: return module == "ember.nn" or module.startswith("ember.nn.")

def _imported_module(node: ast.Call) -> str | None:
  """The module an `importlib.import_module("...")` or `__import__("...")` call with a literal name imports."""
  func = ast.unparse(node.func)
  if func not in ("importlib.import_module", "import_module", "__import__") or not node.args: return None
  first = node.args[0]
  return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None

def non_public_imports(source: str, public: dict[str, frozenset[str]]) -> list[str]:
  """Every core module or name `source` reaches that is not public: imports (also inside functions, and
  `importlib.import_module` of a literal name) and attribute access through `import ember` (`ember.tensor.x`)."""
  bad: list[str] = []
  def module_ok(module: str) -> bool: return not _core(module) or _own(module) or module in public
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      bad += [a.name for a in node.names if not module_ok(a.name)]
    elif isinstance(node, ast.Call) and (module := _imported_module(node)) is not None:
      bad += [] if module_ok(module) else [module]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
      if not module_ok(node.module): bad.append(node.module)
      elif node.module in public:
        bad += [f"{node.module}.{a.name}" for a in node.names if a.name != "*" and a.name not in public[node.module]]
    elif isinstance(node, ast.Attribute):
      owner = ast.unparse(node.value)
      if owner in public and node.attr not in public[owner]:
        bad.append(f"{owner}.{node.attr}")
  return bad

@pytest.mark.parametrize("source, bad", [
  ("from ember import Tensor, dtypes, nn\nfrom ember.errors import ShapeError\nfrom ember.dtype import DType", []),
  ("import ember\nx = ember.Tensor([1]).realize()\ny = ember.errors.ShapeError\nimport ember.nn.state", []),
  ("from ember.nn.functional import assign\nfrom . import layers\nfrom ember_cpu.device import CPUDevice", []),
  ("from ember.plugin import Compiled, hookimpl\nfrom ember.plugin import *", []),
  ("from ember.schedule import buffer_of", ["ember.schedule"]),
  ("from ember.tensor import Tensor, _is_done", ["ember.tensor"]),
  ("def f():\n  from ember.helpers import TRAINING", ["ember.helpers"]),
  ("from ember.dtype import dtypes, strong_dtype, sum_acc_dtype", ["ember.dtype.sum_acc_dtype"]),
  ("from ember import Tensor, all_tensors", ["ember.all_tensors"]),
  ("import ember.uop.ops as ops", ["ember.uop.ops"]),
  ("import ember\nn = ember.tensor._is_done(x)", ["ember.tensor"]),
  ("import ember\nacc = ember.dtype.sum_acc_dtype(ember.dtypes.half)", ["ember.dtype.sum_acc_dtype"]),
  ("import importlib\nm = importlib.import_module('ember.device.base')", ["ember.device.base"]),
  ("from ember.plugin import Buffer, _registry", ["ember.plugin._registry"]),
])
def test_scanner_finds_non_public_imports(source: str, bad: list[str]) -> None:
  assert non_public_imports(source, public_names()) == bad

def _spec_dir(module: str) -> Path | None:
  """The directory Python imports package `module` from, found without importing it; None if it is not importable."""
  try: spec = importlib.util.find_spec(module)
  except ModuleNotFoundError: return None
  if spec is None or not spec.submodule_search_locations: return None
  return Path(next(iter(spec.submodule_search_locations))).resolve()

def nn_dirs() -> list[Path]:
  """ember.nn's package directory: this checkout's source and the one Python imports (the same for an editable
  install; site-packages for installed wheels)."""
  found = {NN_CHECKOUT.resolve()} if NN_CHECKOUT.is_dir() else set()
  if (installed := _spec_dir("ember.nn")) is not None: found.add(installed)
  return sorted(found)

def backend_dirs() -> list[Path]:
  """Every backend's package directory: this checkout's (packages/backend-*/src/*) and every installed backend's (the
  `ember.backends` entry points)."""
  found = {p.parent.resolve() for p in REPO.glob("packages/backend-*/src/*/plugin.py")}
  for entry in importlib.metadata.entry_points(group="ember.backends"):
    if (installed := _spec_dir(entry.value.partition(".")[0].partition(":")[0])) is not None: found.add(installed)
  return sorted(found)

def python_files(dirs: list[Path], what: str) -> list[Path]:
  """The Python files under `dirs`; fails the test when there is none, so a search that finds nothing cannot pass."""
  files = sorted({f for d in dirs for f in d.rglob("*.py")})
  if not files:
    pytest.fail(f"no {what} source to check: found no Python file in {[str(d) for d in dirs] or 'no directory'}; "
                "run the tests from the checkout or with the packages installed")
  return files

def test_file_search_fails_when_it_finds_nothing(tmp_path: Path) -> None:
  (tmp_path / "empty").mkdir()
  for dirs in ([], [tmp_path / "empty"], [tmp_path / "missing"]):
    with pytest.raises(pytest.fail.Exception, match="no ember-nn source to check"): python_files(dirs, "ember-nn")

def test_file_search_covers_what_python_imports() -> None:
  import ember.nn
  files = python_files(nn_dirs(), "ember-nn")
  assert Path(ember.nn.__file__).resolve() in files
  assert {"state.py", "gguf.py", "pth.py", "optim.py", "model.py"} <= {f.name for f in files}
  backends = backend_dirs()
  for entry in importlib.metadata.entry_points(group="ember.backends"):
    spec = importlib.util.find_spec(entry.value.partition(".")[0])
    assert spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent in backends
  assert all((d / "plugin.py").exists() for d in backends), backends

@pytest.mark.parametrize("what, dirs", [("ember-nn", nn_dirs), ("backend", backend_dirs)])
def test_packages_import_only_public_core_names(what: str, dirs: object) -> None:
  public = public_names()
  offenders = {}
  for path in python_files(dirs(), what):  # type: ignore[operator]
    if (bad := non_public_imports(path.read_text(), public)): offenders[str(path)] = bad
  assert offenders == {}, (f"{what} sources reach core internals; use the public API (docs/public-api.md) or add what "
                           f"is missing to it: {offenders}")
