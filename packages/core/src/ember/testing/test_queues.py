"""Tier 5, queues and signals: only for devices that register HCQ interfaces through ``ember_register_queues``."""
from __future__ import annotations
import pytest

pytestmark = pytest.mark.ember_tier("queues")

def test_registered_interfaces_have_queue_factories(ember_device, ember_capabilities):
  from ember.device import Device
  if not ember_capabilities.queue_interfaces: pytest.skip(f"{ember_device} registers no HCQ queue interfaces")
  head = ember_device.partition(":")[0]
  for iface in ember_capabilities.queue_interfaces:
    assert callable(Device.queue_factory(head, iface)), f"{head} interface {iface}: factory is not callable"
  assert set(ember_capabilities.queue_interfaces) <= set(Device.registry.interfaces(head))

def test_an_unregistered_interface_is_a_typed_error(ember_device, ember_capabilities):
  from ember.device import Device
  from ember.errors import DeviceError
  if not ember_capabilities.queue_interfaces: pytest.skip(f"{ember_device} registers no HCQ queue interfaces")
  with pytest.raises(DeviceError):
    Device.queue_factory(ember_device.partition(":")[0], "NO_SUCH_INTERFACE")

def test_mock_interfaces_are_never_chosen_automatically(ember_device, ember_capabilities):
  from ember.device import Device
  ifaces = Device.registry.interfaces(ember_device.partition(":")[0])
  if not ifaces or not all(i.startswith("MOCK") for i in ifaces): pytest.skip(f"{ember_device} is not MOCK-only")
  assert ember_device.partition(":")[0] not in [e.name for e in Device.registry.auto_candidates()]
