"""Suite-wide settings and fixtures for ember-core's tests.

The environment is set before anything imports ember: backends load strictly (a broken plugin fails the run) and the
IR spec checker is on. `fake_site` builds throwaway backend distributions (a ``*.dist-info`` folder with METADATA and
entry_points.txt next to the plugin module, no pip) for the plugin-discovery tests.
"""
from __future__ import annotations
import os
os.environ["EMBER_STRICT_BACKENDS"] = "1"
os.environ["SPEC"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shared test helpers (torch_oracle) import by name

TOY_PLUGIN = '''
from __future__ import annotations
from ember.plugin import PLUGIN_API_VERSION, Allocator, BackendInfo, Compiled, Compiler, ProbeResult, Renderer, hookimpl

OPENED = []

class ToyAllocator(Allocator):
  def _alloc(self, size, options): return bytearray(size)
  def _copyin(self, dest, src): dest[:] = src
  def _copyout(self, dest, src): dest[:] = src

class ToyRenderer(Renderer):
  def __init__(self, name, arch):
    self.name, self.arch = name, arch
  def render(self, uops, name="kernel"): return f"{{self.name}}:{{name}}"

class ToyCompiler(Compiler):
  def __init__(self, renderer):
    super().__init__(None)
    self.renderer = renderer
  def compile(self, src): return src.encode()

def make_device(device, renderer, compiler):
  OPENED.append(device)
  return Compiled(device, ToyAllocator(), renderer, compiler, lambda name, lib: None)

@hookimpl
def ember_backend_info():
  return BackendInfo(name={backend!r}, api_version={api_version}, requires_core={requires_core!r},
                     priority={backend_priority}, description="toy backend {backend}")

@hookimpl
def ember_register_devices(registry):
  for device in {devices!r}: registry.add(device, make_device, priority={priority}, interfaces={interfaces!r})

@hookimpl
def ember_register_renderers(registry):
  for device in {devices!r}:
    for i, name in enumerate({renderers!r}):
      registry.add(device, name, lambda arch, name=name: ToyRenderer(name, arch), priority=-i)

@hookimpl
def ember_register_compilers(registry):
  for device in {devices!r}:
    for name in {renderers!r}: registry.add(device, name, ToyCompiler)
'''

def _ember_parent() -> str:
  import ember
  return os.path.dirname(os.path.dirname(os.path.abspath(ember.__file__)))

class FakeSite:
  """A folder on sys.path holding fake backend distributions. Module names are unique per site, so in-process tests
  never see a module another test cached in sys.modules."""
  def __init__(self, root: Path):
    self.root = root
    self.uid = uuid.uuid4().hex[:8]
    self.sources: list[Any] = []

  def add(self, backend: str, source: str, dist: str | None = None, version: str = "1.0.0") -> str:
    """Write plugin module + dist-info for backend ``backend``; returns the module name."""
    from ember.device.registry import BackendSource
    dist = dist or f"ember-backend-{backend}"
    module = f"{backend}_plugin_{self.uid}"
    (self.root / f"{module}.py").write_text(textwrap.dedent(source))
    info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[ember.backends]\n{backend} = {module}\n")
    self.sources.append(BackendSource(backend, module, dist, version))
    return module

  def add_toy(self, backend: str, devices: tuple[str, ...] = ("TOY",), renderers: tuple[str, ...] = ("TC",),
              priority: int = 10, interfaces: tuple[str, ...] = (), api_version: str = "PLUGIN_API_VERSION",
              requires_core: str = ">=0.1", backend_priority: int = 0, extra: str = "", **kw: Any) -> str:
    """A working backend registering ``devices``, each with ``renderers`` (priority in list order) and a compiler per
    renderer. ``extra`` is appended to the module, so it can add hooks or redefine the ones above."""
    source = TOY_PLUGIN.format(backend=backend, devices=devices, renderers=renderers, priority=priority,
                               interfaces=interfaces, api_version=api_version, requires_core=requires_core,
                               backend_priority=backend_priority)
    return self.add(backend, source + textwrap.dedent(extra), **kw)

  def registry(self, **kwargs: Any) -> Any:
    from ember.device.registry import BackendRegistry
    return BackendRegistry(self.sources, **kwargs)

  def run(self, code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run python in a fresh process that sees this site (entry points from its dist-info folders) and ember."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_") and k != "DEV"}
    base["PYTHONPATH"] = os.pathsep.join([str(self.root), _ember_parent()])
    cmd = [sys.executable, *(["-c", code] if code else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env={**base, **env}, timeout=120)

@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
  site = tmp_path / "site"
  site.mkdir()
  monkeypatch.syspath_prepend(str(site))
  return FakeSite(site)
