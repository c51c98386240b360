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
# ** re-exports: everything a backend may build on **
from ember.device.base import (Allocator, Buffer, BufferSpec, Compiled, Compiler, LRUAllocator, Program, from_mv,
                               mv_address)
from ember.device.elf import ElfFile, ElfSection, ElfSegment, ElfSymbol, elf_image_size, read_elf
from ember.device.hcq import (HCQAllocator, HCQArgs, HCQBuffer, HCQCompiled, HCQGraph, HCQProgram, HCQSignal,
                              HWQueue)
from ember.device.hostshim import (HostKernel, HostShimCompiler, ShimDialect, aligned_layout, load_shim,
                                   shim_arg_layout, signature_layout)
from ember.device.registration import (PLUGIN_API_VERSION, PROJECT_NAME, BackendInfo, CompilerEntry, CompilerFactory,
                                         CompilerRegistry, DeviceEntry, DeviceFactory, DeviceRegistry, PluginWarning,
                                         ProbeResult, QueueEntry, QueueRegistry, RendererEntry, RendererFactory,
                                         RendererRegistry, hookimpl, hookspec)
from ember.dtype import DType, PtrDType, dtypes
from ember.errors import (AxisError, CompileError, DeviceError, DTypeError, EmberError, GradientError, JitError,
                          MemoryAccessError, OutOfMemoryError, PluginError, ShapeError)
from ember.helpers import NUM_CPU_THREADS, QDOT, Target, getenv
from ember.renderer import Estimates, ProgramSpec, Renderer
from ember.renderer.cstyle import CStyleLanguage, ptr_dtype, text_rules, value_dtype
from ember.renderer.llvmir import JIT_RUNTIME_SYMBOLS, LLVMRenderer, jit_runtime_ir
from ember.uop.ops import AddrSpace, AxisType, GroupOp, KernelInfo, Ops, QDOT_PLANE, UOp
from ember.uop.rewrite import PatternMatcher, UPat, graph_rewrite

class EmberHookSpec:
  """The hooks a backend implements (all optional except `ember_backend_info`). No hook is ``historic``."""

  @hookspec
  def ember_backend_info(self) -> BackendInfo:  # type: ignore[empty-body]  # a hookspec's body never runs
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
    ``python -m ember devices``; always in a child process (once per device and ``DEV`` selection; core keeps the
    answer), so a native library that aborts, crashes or hangs makes the device unavailable instead of killing the
    user's interpreter. State the probe sets up does not reach the process that opens the device.
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
  "Renderer", "ProgramSpec", "Estimates", "CStyleLanguage", "text_rules", "value_dtype", "ptr_dtype", "LLVMRenderer",
  "JIT_RUNTIME_SYMBOLS",
  "jit_runtime_ir", "Allocator", "LRUAllocator", "BufferSpec",
  "Buffer", "Compiler", "Compiled", "Program", "from_mv", "mv_address", "UOp", "Ops", "GroupOp", "AxisType", "UPat",
  "KernelInfo", "AddrSpace", "QDOT", "QDOT_PLANE",
  "PatternMatcher", "graph_rewrite", "DType", "PtrDType", "dtypes", "EmberError", "ShapeError", "AxisError",
  "DTypeError", "DeviceError", "PluginError", "CompileError", "MemoryAccessError", "OutOfMemoryError", "JitError",
  "GradientError",
  "Target", "getenv", "NUM_CPU_THREADS", "HWQueue", "HCQSignal", "HCQBuffer", "HCQArgs", "HCQProgram", "HCQAllocator",
  "HCQCompiled", "HCQGraph", "ShimDialect", "HostShimCompiler", "HostKernel", "load_shim", "aligned_layout",
  "signature_layout", "shim_arg_layout", "ElfFile", "ElfSection", "ElfSegment", "ElfSymbol", "read_elf",
  "elf_image_size",
]
