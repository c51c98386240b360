"""The public plugin API: hookspecs, registries, re-exports, and the rule that backends import only ember.plugin."""
from __future__ import annotations
import ast
import importlib.metadata
import importlib.util
import inspect
import typing
from pathlib import Path
import pluggy
import pytest
import ember.plugin as plugin
from ember.errors import PluginError

REPO = Path(__file__).resolve().parents[3]
HOOKS = ["ember_backend_info", "ember_register_devices", "ember_register_renderers", "ember_register_compilers",
         "ember_register_queues", "ember_probe"]

def test_hookspecs_are_exactly_the_protocol() -> None:
  specs = [n for n, f in inspect.getmembers(plugin.EmberHookSpec, inspect.isfunction) if hasattr(f, "ember_spec")]
  assert sorted(specs) == sorted(HOOKS)

@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_is_typed_and_documented(hook: str) -> None:
  fn = getattr(plugin.EmberHookSpec, hook)
  doc = inspect.getdoc(fn) or ""
  assert "When:" in doc and "Returns:" in doc, f"{hook} must say when core calls it and what it returns"
  hints = typing.get_type_hints(fn, vars(plugin))
  params = [p for p in inspect.signature(fn).parameters if p != "self"]
  assert "return" in hints and all(p in hints for p in params)

def test_firstresult_only_on_probe() -> None:
  pm = pluggy.PluginManager(plugin.PROJECT_NAME)
  pm.add_hookspecs(plugin.EmberHookSpec)
  for hook in HOOKS:
    opts = getattr(pm.hook, hook).spec.opts
    assert opts["firstresult"] == (hook == "ember_probe") and not opts["historic"]

def test_probe_firstresult_semantics() -> None:
  class Silent:
    @plugin.hookimpl
    def ember_probe(self, device: str) -> plugin.ProbeResult | None: return None
  class Answers:
    @plugin.hookimpl
    def ember_probe(self, device: str) -> plugin.ProbeResult | None:
      return plugin.ProbeResult(False, "no driver") if device == "X" else None
  pm = pluggy.PluginManager(plugin.PROJECT_NAME)
  pm.add_hookspecs(plugin.EmberHookSpec)
  pm.register(Answers())
  pm.register(Silent())
  assert pm.hook.ember_probe(device="X") == plugin.ProbeResult(False, "no driver")
  assert pm.hook.ember_probe(device="Y") is None

REEXPORTS = {
  "ember.renderer": ["Renderer", "ProgramSpec", "Estimates"],
  "ember.renderer.cstyle": ["CStyleLanguage"],
  "ember.renderer.llvmir": ["LLVMRenderer"],
  "ember.device.base": ["Allocator", "LRUAllocator", "BufferSpec", "Buffer", "Compiler", "Compiled", "Program",
                        "from_mv", "mv_address"],
  "ember.uop.ops": ["UOp", "Ops", "GroupOp", "AxisType"],
  "ember.uop.rewrite": ["UPat", "PatternMatcher", "graph_rewrite"],
  "ember.dtype": ["DType", "PtrDType", "dtypes"],
  "ember.errors": ["EmberError", "DeviceError", "PluginError", "CompileError", "MemoryAccessError", "ShapeError",
                   "DTypeError"],
  "ember.helpers": ["Target", "getenv", "NUM_CPU_THREADS"],
  "ember.device.hostshim": ["ShimDialect", "HostShimCompiler", "HostKernel", "load_shim", "aligned_layout",
                            "signature_layout", "shim_arg_layout"],
  "ember.device.elf": ["ElfFile", "ElfSection", "ElfSegment", "ElfSymbol", "read_elf", "elf_image_size"],
}

@pytest.mark.parametrize("module, names", list(REEXPORTS.items()))
def test_reexports_are_the_core_objects(module: str, names: list[str]) -> None:
  import importlib
  source = importlib.import_module(module)
  for name in names:
    assert getattr(plugin, name) is getattr(source, name), name
    assert name in plugin.__all__

def test_all_names_exist() -> None:
  assert [n for n in plugin.__all__ if not hasattr(plugin, n)] == []

LIGHT_IMPORTS = {"__future__", "re", "dataclasses", "typing", "pluggy", "ember.device.base", "ember.dtype",
                 "ember.errors", "ember.helpers", "ember.renderer", "ember.renderer.cstyle", "ember.renderer.llvmir",
                 "ember.uop.ops", "ember.uop.rewrite", "ember.device.hcq", "ember.device.hostshim",
                 "ember.device.registration", "ember.device.elf"}

def test_plugin_module_top_imports_are_light() -> None:
  tree = ast.parse(Path(plugin.__file__).read_text())
  top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
  names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
  assert names <= LIGHT_IMPORTS, names - LIGHT_IMPORTS

# ** registries **

def test_device_registry_normalises_and_validates() -> None:
  reg = plugin.DeviceRegistry("foo")
  def factory(device: str, renderer: object, compiler: object) -> plugin.Compiled: raise AssertionError("not called")
  reg.add("foo", factory, priority=3, interfaces=("pci", "mock"))
  assert reg.entries == [plugin.DeviceEntry("FOO", factory, 3, ("PCI", "MOCK"), "foo")]
  with pytest.raises(PluginError, match="registered device FOO twice"): reg.add("Foo", factory)
  with pytest.raises(PluginError, match="invalid device name '1X'"): reg.add("1X", factory)
  with pytest.raises(PluginError, match="invalid interface name 'MO CK'"):
    reg.add("BAR", factory, interfaces=("MO CK",))
  with pytest.raises(PluginError, match="not callable"): reg.add("BAZ", "nope")  # type: ignore[arg-type]

def _renderer(arch: str) -> plugin.Renderer: raise AssertionError("not called")
def _compiler(renderer: plugin.Renderer) -> plugin.Compiler: raise AssertionError("not called")

def test_renderer_compiler_queue_registries() -> None:
  renderers, compilers, queues = plugin.RendererRegistry("b"), plugin.CompilerRegistry("b"), plugin.QueueRegistry("b")
  renderers.add("cpu", "llvm", _renderer, priority=2)
  assert renderers.entries == [plugin.RendererEntry("CPU", "LLVM", _renderer, 2, "b")]
  with pytest.raises(PluginError, match="registered renderer LLVM for device CPU twice"):
    renderers.add("CPU", "LLVM", _renderer)
  with pytest.raises(PluginError, match="invalid renderer name 'L-L'"): renderers.add("CPU", "L-L", _renderer)
  compilers.add("cpu", "llvm", _compiler)
  assert compilers.entries == [plugin.CompilerEntry("CPU", "LLVM", _compiler, "b")]
  with pytest.raises(PluginError, match="compiler for CPU:LLVM twice"): compilers.add("CPU", "llvm", _compiler)
  queues.add("nv", "mock", _renderer)
  assert (queues.entries[0].device, queues.entries[0].interface) == ("NV", "MOCK")
  with pytest.raises(PluginError, match="interface MOCK for device NV twice"): queues.add("NV", "MOCK", _renderer)

# ** the import boundary: a backend imports ember.plugin and nothing else from core **

def private_core_imports(source: str) -> list[str]:
  """Every `ember` import in ``source`` other than `ember.plugin`."""
  bad = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
      bad += [n for n in names if (n == "ember" or n.startswith("ember.")) and n != "ember.plugin"]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
      if node.module == "ember": bad += [f"ember.{a.name}" for a in node.names if a.name != "plugin"]
      elif node.module.startswith("ember.") and node.module != "ember.plugin": bad.append(node.module)
  return bad

@pytest.mark.parametrize("source, bad", [
  ("from ember.plugin import hookimpl", []),
  ("import ember.plugin as p", []),
  ("from ember import plugin", []),
  ("import ember_cpu.device\nfrom embers import x", []),
  ("from ember.device.base import Buffer", ["ember.device.base"]),
  ("def f():\n  import ember.helpers", ["ember.helpers"]),
  ("import ember", ["ember"]),
  ("from ember import Tensor, plugin", ["ember.Tensor"]),
])
def test_private_import_scanner(source: str, bad: list[str]) -> None:
  assert private_core_imports(source) == bad

def backend_packages() -> dict[str, Path]:
  """Every backend's top-level package directory, by package name: those of this checkout (packages/backend-*/src/*)
  and those of the installed backends (the `ember.backends` entry points), found without importing them."""
  found = {pkg.name: pkg for pkg in REPO.glob("packages/backend-*/src/*") if (pkg / "plugin.py").exists()}
  for entry in importlib.metadata.entry_points(group="ember.backends"):
    spec = importlib.util.find_spec(entry.value.partition(".")[0])
    if spec is not None and spec.submodule_search_locations:
      found.setdefault(spec.name, Path(list(spec.submodule_search_locations)[0]))
  return found

def backend_sources() -> dict[str, list[Path]]:
  """The Python files of every backend package, by package name. Fails, rather than passing with nothing checked,
  when there is no backend to check or a backend package holds no Python file."""
  packages = backend_packages()
  assert packages, (f"no backend package found to check (no packages/backend-*/src/*/plugin.py under {REPO} and no "
                    "installed ember.backends entry point); run the tests from the checkout")
  sources = {name: sorted(path.rglob("*.py")) for name, path in sorted(packages.items())}
  assert all(sources.values()), f"backend packages without Python files: {[n for n, f in sources.items() if not f]}"
  return sources

def test_backend_search_covers_every_backend() -> None:
  sources = backend_sources()
  checkout = {p.parent.name for p in REPO.glob("packages/backend-*/src/*/plugin.py")}
  installed = {e.value.partition(".")[0] for e in importlib.metadata.entry_points(group="ember.backends")}
  assert checkout | installed <= set(sources)
  for name, files in sources.items():
    assert "plugin.py" in {f.name for f in files}, f"{name} has no plugin.py (its entry point module)"

def hookimpl_signatures(source: str) -> dict[str, dict[str, str]]:
  """Hook name -> {parameter or "return": annotation text} of every `@hookimpl` function in a plugin module."""
  out = {}
  for node in ast.parse(source).body:
    if not isinstance(node, ast.FunctionDef) or not any("hookimpl" in ast.unparse(d) for d in node.decorator_list):
      continue
    annotations = {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in node.args.args}
    out[node.name] = {**annotations, "return": ast.unparse(node.returns) if node.returns else ""}
  return out

def test_hookimpl_scanner() -> None:
  source = "@hookimpl\ndef ember_probe(device: str) -> ProbeResult | None: ...\ndef helper(x): ...\n" \
           "@plugin.hookimpl\ndef ember_register_queues(registry):\n  pass\n"
  assert hookimpl_signatures(source) == {"ember_probe": {"device": "str", "return": "ProbeResult | None"},
                                         "ember_register_queues": {"registry": "", "return": ""}}

def test_backend_hooks_are_typed_as_the_hookspecs() -> None:
  """Every hook of every backend is annotated exactly as its hookspec (the registry classes, `ProbeResult | None`...),
  never `Any`: the annotations are what a backend author copies."""
  specs = {hook: {**{p.name: str(p.annotation) for p in inspect.signature(getattr(plugin.EmberHookSpec, hook))
                     .parameters.values() if p.name != "self"},
                  "return": str(inspect.signature(getattr(plugin.EmberHookSpec, hook)).return_annotation)}
           for hook in HOOKS}
  wrong = {}
  for name, files in backend_sources().items():
    plugin_module = next(f for f in files if f.name == "plugin.py")
    for hook, typed in hookimpl_signatures(plugin_module.read_text()).items():
      if hook not in specs: wrong[f"{name}.{hook}"] = "not a hook of EmberHookSpec"
      elif typed != specs[hook]: wrong[f"{name}.{hook}"] = f"{typed}, expected {specs[hook]}"
  assert wrong == {}, wrong

def test_backends_import_only_the_plugin_api() -> None:
  offenders = {}
  for files in backend_sources().values():
    for path in files:
      if (bad := private_core_imports(path.read_text())): offenders[str(path)] = bad
  assert offenders == {}, f"backends must import only ember.plugin from core: {offenders}"
