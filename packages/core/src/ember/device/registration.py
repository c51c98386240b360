"""How a backend registers itself: the hook markers, `BackendInfo`/`ProbeResult`, and the four registries each backend
fills at loading. Backends reach all of this through `ember.plugin`, which re-exports it next to the documented hook
specifications; it lives here, in the device layer, because the device registry (`ember.device.registry`) and core's
own backend (`ember.device.builtin`) build on it."""
from __future__ import annotations
import re
from dataclasses import dataclass
from typing import Any, Callable
import pluggy
from ember.device.base import Compiled, Compiler
from ember.errors import PluginError
from ember.renderer import Renderer

PROJECT_NAME = "ember"
PLUGIN_API_VERSION = 1
"""The version of this hook protocol. A backend reports the version it was written for in `BackendInfo.api_version`;
core refuses (status ``incompatible``) a backend whose version differs."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a function in a backend's plugin module as an implementation of one of the hooks in `EmberHookSpec`."""
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

class PluginWarning(UserWarning):
  """Issued once per backend that failed to load or is incompatible; the backend is skipped, not fatal."""

@dataclass(frozen=True)
class BackendInfo:
  """What a backend says about itself, returned by `EmberHookSpec.ember_backend_info`.

  * ``name``: the backend name; must equal the entry-point name (``cpu`` for ``cpu = "ember_cpu.plugin"``).
  * ``api_version``: the `PLUGIN_API_VERSION` the backend was written against.
  * ``requires_core``: the ember-core versions it works with, comma-separated clauses of ``>=, >, <=, <, ==, !=``
    followed by a dotted version, e.g. ``">=0.1,<0.2"``. Checked against ``ember.__version__``.
  * ``priority``: breaks ties between devices of equal device priority when ``DEV`` is unset (higher wins).
  * ``description``: one line for ``python -m ember devices``.
  """
  name: str
  api_version: int
  requires_core: str
  priority: int = 0
  description: str = ""

@dataclass(frozen=True)
class ProbeResult:
  """The answer of `EmberHookSpec.ember_probe`: ``ok`` if the device can be opened here, else ``reason`` says why
  (missing driver, no GPU, library version ...) and ideally how to fix it."""
  ok: bool
  reason: str = ""

DeviceFactory = Callable[[str, "Renderer | None", "Compiler | None"], Compiled]
"""Opens a device: ``factory(device, renderer, compiler) -> Compiled``. ``device`` is the canonical device string
(``"CPU"``, ``"CPU:1"``, ``"DISK:/path"``); ``renderer``/``compiler`` are the ones core selected for it (None when
none is registered). Called once per canonical device string; the result is cached by core."""
RendererFactory = Callable[[str], Renderer]
"""Builds a renderer: ``factory(arch) -> Renderer``; ``arch`` is the ARCH field of ``DEV`` or ``""`` (native)."""
CompilerFactory = Callable[[Renderer], Compiler]
"""Builds the compiler for a renderer: ``factory(renderer) -> Compiler`` (read ``renderer.arch`` for the target)."""

_name_re = re.compile(r"^[A-Z_][A-Z0-9_]*$")

def _check_name(kind: str, name: str, backend: str) -> str:
  if not isinstance(name, str) or not _name_re.match(name.upper()):
    raise PluginError(f"backend {backend!r} registered an invalid {kind} name {name!r}; "
                      "names are identifiers such as 'CPU'")
  return name.upper()

def _check_callable(kind: str, factory: Any, backend: str) -> None:
  if not callable(factory):
    raise PluginError(f"backend {backend!r} registered a {kind} factory that is not callable: {factory!r}")

@dataclass(frozen=True)
class DeviceEntry:
  """One registered device (core's view of a `DeviceRegistry.add` call)."""
  name: str
  factory: DeviceFactory
  priority: int
  interfaces: tuple[str, ...]
  backend: str

@dataclass(frozen=True)
class RendererEntry:
  """One registered renderer (core's view of a `RendererRegistry.add` call)."""
  device: str
  name: str
  factory: RendererFactory
  priority: int
  backend: str

@dataclass(frozen=True)
class CompilerEntry:
  """One registered compiler (core's view of a `CompilerRegistry.add` call)."""
  device: str
  renderer: str
  factory: CompilerFactory
  backend: str

@dataclass(frozen=True)
class QueueEntry:
  """One registered queue factory (core's view of a `QueueRegistry.add` call)."""
  device: str
  interface: str
  factory: Callable[..., Any]
  backend: str

class DeviceRegistry:
  """Passed to `EmberHookSpec.ember_register_devices`; collects the devices of one backend.

  Core gives every backend its own registry, so what a backend adds is attributed to it and is discarded whole if any
  of its hooks raises.
  """
  def __init__(self, backend: str) -> None:
    self.backend = backend
    self.entries: list[DeviceEntry] = []
  def add(self, name: str, factory: DeviceFactory, priority: int = 0, interfaces: tuple[str, ...] = ()) -> None:
    """Register device ``name`` (case-insensitive, stored upper-case), opened by ``factory``.

    ``priority`` orders devices when ``DEV`` is unset: the highest-priority device whose probe is ok becomes
    ``Device.DEFAULT``. A negative priority means "never chosen automatically" (NULL, DISK use it). ``interfaces``
    names the ways the device can be driven (``"PCI"``, ``"KFD"``, ``"MOCK"`` ...), selected with
    ``DEV=IFACE+DEVICE``; a device whose interfaces are all MOCK is never chosen automatically.
    Registering the same name twice in one backend is a `PluginError`; the same name from two backends is a conflict
    that core reports (it never picks one silently).
    """
    name = _check_name("device", name, self.backend)
    _check_callable("device", factory, self.backend)
    if any(e.name == name for e in self.entries):
      raise PluginError(f"backend {self.backend!r} registered device {name} twice")
    ifaces = tuple(_check_name("interface", i, self.backend) for i in interfaces)
    self.entries.append(DeviceEntry(name, factory, int(priority), ifaces, self.backend))

class RendererRegistry:
  """Passed to `EmberHookSpec.ember_register_renderers`; collects renderers keyed by (device, renderer name).

  A backend may add a renderer to a device it does not own (e.g. an AMD backend adding its renderer to ``NULL``).
  """
  def __init__(self, backend: str) -> None:
    self.backend = backend
    self.entries: list[RendererEntry] = []
  def add(self, device: str, name: str, factory: RendererFactory, priority: int = 0) -> None:
    """Register renderer ``name`` for ``device``; ``factory(arch)`` builds it. Selected by ``DEV=DEVICE:NAME``; with no
    renderer in ``DEV`` core tries the device's renderers by descending ``priority`` and keeps the first that builds."""
    device = _check_name("device", device, self.backend)
    name = _check_name("renderer", name, self.backend)
    _check_callable("renderer", factory, self.backend)
    if any(e.device == device and e.name == name for e in self.entries):
      raise PluginError(f"backend {self.backend!r} registered renderer {name} for device {device} twice")
    self.entries.append(RendererEntry(device, name, factory, int(priority), self.backend))

class CompilerRegistry:
  """Passed to `EmberHookSpec.ember_register_compilers`; collects compilers keyed by (device, renderer name)."""
  def __init__(self, backend: str) -> None:
    self.backend = backend
    self.entries: list[CompilerEntry] = []
  def add(self, device: str, renderer: str, factory: CompilerFactory) -> None:
    """Register the compiler for output of renderer ``renderer`` on ``device``; ``factory(renderer_instance)``
    builds it. A device opened with a renderer that has no compiler gets ``compiler=None`` in its factory."""
    device = _check_name("device", device, self.backend)
    renderer = _check_name("renderer", renderer, self.backend)
    _check_callable("compiler", factory, self.backend)
    if any(e.device == device and e.renderer == renderer for e in self.entries):
      raise PluginError(f"backend {self.backend!r} registered a compiler for {device}:{renderer} twice")
    self.entries.append(CompilerEntry(device, renderer, factory, self.backend))

class QueueRegistry:
  """Passed to `EmberHookSpec.ember_register_queues`; collects HCQ queue factories keyed by (device, interface)."""
  def __init__(self, backend: str) -> None:
    self.backend = backend
    self.entries: list[QueueEntry] = []
  def add(self, device: str, interface: str, factory: Callable[..., Any]) -> None:
    """Register how ``device`` is driven through ``interface`` (``"KFD"``, ``"PCI"``, ``"MOCK"`` ...). ``factory`` is
    backend-defined (usually returns the interface object that creates compute/copy queues); core only lists it and
    hands it back through `queue_factory`. MOCK interfaces are used only when ``DEV`` names them."""
    device = _check_name("device", device, self.backend)
    interface = _check_name("interface", interface, self.backend)
    _check_callable("queue", factory, self.backend)
    if any(e.device == device and e.interface == interface for e in self.entries):
      raise PluginError(f"backend {self.backend!r} registered interface {interface} for device {device} twice")
    self.entries.append(QueueEntry(device, interface, factory, self.backend))
