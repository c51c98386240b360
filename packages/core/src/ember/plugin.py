"""The public plugin API: the ONE module a backend imports.

A backend is a distribution that declares an entry point in the group ``ember.backends``::

  [project.entry-points."ember.backends"]
  foo = "ember_foo.plugin"

The entry name (``foo``) is the backend name; the value is the backend's plugin module. That module only wires things
up: it holds ``@hookimpl`` functions, and imports its heavy classes inside the hook bodies and device factories, so
installing a backend costs nothing until one of its devices is used::

  from ember.plugin import hookimpl, BackendInfo, DeviceRegistry, RendererRegistry, PLUGIN_API_VERSION

  @hookimpl
  def ember_backend_info() -> BackendInfo:
    return BackendInfo(name="foo", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=10)

  def _foo_device(device: str, renderer, compiler):
    from ember_foo.device import FooDevice  # heavy import: only when FOO is opened
    return FooDevice(device, renderer, compiler)

  @hookimpl
  def ember_register_devices(registry: DeviceRegistry) -> None:
    registry.add("FOO", _foo_device, priority=10, interfaces=("PCI", "MOCK"))

  @hookimpl
  def ember_register_renderers(registry: RendererRegistry) -> None:
    def foo_c(arch: str):
      from ember_foo.renderer import FooRenderer
      return FooRenderer(arch)
    registry.add("FOO", "C", foo_c)

How core uses a backend (the lifecycle every hook docstring below refers to):

1. *Discovery* (first use of ``ember.Device``): core reads entry-point metadata only. ``EMBER_BACKENDS`` (a comma
   allow-list of backend names) and ``EMBER_DISABLE_BACKENDS`` (a comma deny-list) decide which backends load at all;
   ``EMBER_PLUGINS=name=module,...`` adds backends that are not installed (running from a source checkout).
2. *Loading* (still at first use of ``Device``, or when ``python -m ember devices`` lists devices): core imports each
   enabled plugin module, registers it with a pluggy ``PluginManager`` for the project ``"ember"``, calls
   ``ember_backend_info`` and checks the plugin API version and ``requires_core``; then calls the four
   ``ember_register_*`` hooks of that backend, each with a fresh registry object owned by that backend.
   A backend whose import fails, whose hook raises, or whose registration is invalid is isolated: it is recorded as
   ``failed`` (or ``incompatible``) with the reason, a `PluginWarning` is issued once, and a `PluginError` quoting the
   reason is raised only when one of its devices is requested. With ``EMBER_STRICT_BACKENDS=1`` (the test suites set
   it) the error is raised at loading instead.
3. *Use*: ``Device["FOO"]`` calls ``ember_probe("FOO")``, picks a renderer and a compiler from the registries, and calls
   the device factory. ``Device.DEFAULT`` (with ``DEV`` unset) probes devices in priority order.

The plugin API version `PLUGIN_API_VERSION` is an integer, separate from package versions. It changes only when a hook
signature or a registry method changes incompatibly.
"""
from __future__ import annotations
import re
from dataclasses import dataclass
from typing import Any, Callable
import pluggy
# ** re-exports: everything a backend may build on **
from ember.device.base import (Allocator, Buffer, BufferSpec, Compiled, Compiler, LRUAllocator, Program, from_mv,
                               mv_address)
from ember.device.hcq import (HCQAllocator, HCQArgs, HCQBuffer, HCQCompiled, HCQGraph, HCQProgram, HCQSignal,
                              HWQueue)
from ember.device.hostshim import (HostKernel, HostShimCompiler, ShimDialect, aligned_layout, load_shim,
                                   shim_arg_layout, signature_layout)
from ember.dtype import DType, PtrDType, dtypes
from ember.errors import (AxisError, CompileError, DeviceError, DTypeError, EmberError, GradientError, JitError,
                          MemoryAccessError, PluginError, ShapeError)
from ember.helpers import NUM_CPU_THREADS, Target, getenv
from ember.renderer import Estimates, ProgramSpec, Renderer
from ember.renderer.cstyle import CStyleLanguage
from ember.renderer.llvmir import LLVMRenderer
from ember.uop.ops import AxisType, GroupOp, Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat, graph_rewrite

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

class EmberHookSpec:
  """The hooks a backend implements (all optional except `ember_backend_info`). No hook is ``historic``."""

  @hookspec
  def ember_backend_info(self) -> BackendInfo:
    """Describe the backend. Required.

    When: first, right after core imports the plugin module, before any other hook of this backend.
    Returns: a `BackendInfo`. Core calls only this backend's implementation and checks ``api_version`` against
    `PLUGIN_API_VERSION` and ``requires_core`` against the installed ember-core; on a mismatch no other hook of the
    backend is called and it is reported as ``incompatible`` with both versions and the fix.
    """

  @hookspec
  def ember_register_devices(self, registry: DeviceRegistry) -> None:
    """Register the backend's devices with ``registry.add(name, factory, priority, interfaces)``.

    When: once per process, at loading, after a compatible `ember_backend_info`. Must be cheap: register factories,
    do not open devices or import native libraries here.
    Returns: nothing; results go into ``registry``. Raising marks the whole backend ``failed``.
    """

  @hookspec
  def ember_register_renderers(self, registry: RendererRegistry) -> None:
    """Register renderers with ``registry.add(device, name, factory, priority)``, for own devices or anyone's.

    When: once per process, at loading, right after this backend's `ember_register_devices`. Cheap, like above.
    Returns: nothing; results go into ``registry``. Raising marks the whole backend ``failed``.
    """

  @hookspec
  def ember_register_compilers(self, registry: CompilerRegistry) -> None:
    """Register compilers with ``registry.add(device, renderer_name, factory)``.

    When: once per process, at loading. Cheap, like above.
    Returns: nothing; results go into ``registry``. Raising marks the whole backend ``failed``.
    """

  @hookspec
  def ember_register_queues(self, registry: QueueRegistry) -> None:
    """Register HCQ interfaces with ``registry.add(device, interface, factory)``, MOCK interfaces included.

    When: once per process, at loading. Cheap, like above.
    Returns: nothing; results go into ``registry``. Raising marks the whole backend ``failed``.
    """

  @hookspec(firstresult=True)
  def ember_probe(self, device: str) -> ProbeResult | None:
    """Say whether ``device`` (a registered device name such as ``"CPU"``, no index) is usable on this machine.

    When: before core opens a device, when ``Device.DEFAULT`` is computed with ``DEV`` unset, and by
    ``python -m ember devices`` (in a subprocess, so a crashing native library cannot take the report down).
    Returns: a `ProbeResult`, or ``None`` for devices this backend knows nothing about. ``firstresult``: core stops at
    the first implementation returning non-None (pluggy calls the most recently loaded backend first); if every
    implementation returns None the device counts as usable. May import native libraries; must not open the device.
    ``device_target(device).interface`` says which interface ``DEV`` asked for (a MOCK interface needs no hardware).
    A probe that raises counts as "not usable", with the exception as the reason.
    """

def device_target(device: str) -> Target:
  """The parsed selection for ``device`` (``"NV"``, ``"NV:1"``): interface, renderer and arch from ``DEV`` when ``DEV``
  names this device, else empty fields. A device factory reads its interface here (``MOCK`` only when requested)."""
  from ember.device.registry import Device
  return Device.get_target(device)

__all__ = [
  "PROJECT_NAME", "PLUGIN_API_VERSION", "hookimpl", "hookspec", "PluginWarning", "BackendInfo", "ProbeResult",
  "DeviceFactory", "RendererFactory", "CompilerFactory", "DeviceRegistry", "RendererRegistry", "CompilerRegistry",
  "QueueRegistry", "DeviceEntry", "RendererEntry", "CompilerEntry", "QueueEntry", "EmberHookSpec", "device_target",
  "Renderer", "ProgramSpec", "Estimates", "CStyleLanguage", "LLVMRenderer", "Allocator", "LRUAllocator", "BufferSpec",
  "Buffer", "Compiler", "Compiled", "Program", "from_mv", "mv_address", "UOp", "Ops", "GroupOp", "AxisType", "UPat",
  "PatternMatcher", "graph_rewrite", "DType", "PtrDType", "dtypes", "EmberError", "ShapeError", "AxisError",
  "DTypeError", "DeviceError", "PluginError", "CompileError", "MemoryAccessError", "JitError", "GradientError",
  "Target", "getenv", "NUM_CPU_THREADS", "HWQueue", "HCQSignal", "HCQBuffer", "HCQArgs", "HCQProgram", "HCQAllocator",
  "HCQCompiled", "HCQGraph", "ShimDialect", "HostShimCompiler", "HostKernel", "load_shim", "aligned_layout",
  "signature_layout", "shim_arg_layout",
]
