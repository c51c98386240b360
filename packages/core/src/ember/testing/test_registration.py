"""Tier 1, registration and probe: the device is registered, its backend loaded, its probe passes, and it opens with
an allocator, a renderer and a compiler of the plugin API's types."""
from __future__ import annotations
import pytest

pytestmark = pytest.mark.ember_tier("registration")

def test_device_is_registered_by_a_loaded_backend(ember_device):
  from ember.device import Device
  head = ember_device.partition(":")[0]
  entry = Device.registry.device_entry(head)
  assert entry.name == head
  record = Device.registry.record(entry.backend)
  assert record.status == "ok", record.reason

def test_probe_says_usable(ember_device):
  from ember.device import Device
  result = Device.registry.probe(ember_device.partition(":")[0])
  assert result.ok, result.reason

def test_device_opens_with_its_parts(ember_device):
  from ember.plugin import Allocator, Compiled, Compiler, Renderer
  from ember.testing import open_device
  dev = open_device(ember_device)
  assert isinstance(dev, Compiled)
  assert isinstance(dev.allocator, Allocator)
  if dev.renderer is None: pytest.skip(f"{ember_device} registers no renderer (a storage-only device)")
  assert isinstance(dev.renderer, Renderer)
  assert isinstance(dev.compiler, Compiler), f"{ember_device} has a renderer but no compiler registered for it"
  assert callable(dev.runtime)
  dev.synchronize()

def test_device_names_canonicalize(ember_device):
  from ember.device import Device
  from ember.testing import open_device
  assert Device.canonicalize(ember_device.lower()) == ember_device
  assert open_device(ember_device.lower()) is open_device(ember_device)

def test_supported_dtypes_are_real_dtypes(ember_capabilities):
  from ember.dtype import dtypes
  if not ember_capabilities.has_renderer: pytest.skip("no renderer")
  assert ember_capabilities.dtypes, "renderer.supported_dtypes() is empty"
  assert set(ember_capabilities.dtypes) <= set(dtypes.all)
  assert dtypes.float32 in ember_capabilities.dtypes and dtypes.int32 in ember_capabilities.dtypes
