"""Tier 5, queues and signals: only for devices that register HCQ interfaces through ``ember_register_queues``.

Beyond the registration checks, an HCQ device's queues must do their work: copies land byte for byte, a wait holds
back everything after it until its signal reaches the value, a queue submits again with patched values, timestamps
never go backwards. Devices without HCQ queues skip these with the reason."""
from __future__ import annotations
import ctypes
from typing import Any
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

# ** the queues at work: submit, signal, wait, copy, timestamps **
# Each test drives the device's own HCQ queues with fresh signals in host-visible memory the device writes
# (`_host_alloc`, the HCQ backend hook for kernargs and staging), and ends by waiting on what it submitted.

def _hcq_device(ember_device: str) -> Any:
  from ember.device import Device
  from ember.device.hcq import HCQCompiled
  dev = Device[ember_device]
  if not isinstance(dev, HCQCompiled): pytest.skip(f"{ember_device} has no HCQ queues ({type(dev).__name__})")
  return dev

def _signals(dev: Any, n: int) -> list[Any]:
  """`n` zeroed signals, each in its own 16-byte slot after an unused first one: a timestamp may write the 8 bytes
  below its signal's word (NV's 16-byte semaphore record)."""
  from ember.device.hcq import HCQSignal
  mem = dev._host_alloc(16 * (n + 1))
  ctypes.memset(mem.va_addr, 0, 16 * (n + 1))
  return [HCQSignal(mem.va_addr + 16 * (i + 1), dev._progress) for i in range(n)]

def _host_bytes(dev: Any, data: bytes) -> Any:
  buf = dev._host_alloc(len(data))
  ctypes.memmove(buf.va_addr, data, len(data))
  return buf

def _read(buf: Any, nbytes: int) -> bytes: return ctypes.string_at(buf.va_addr, nbytes)

def _pattern(nbytes: int, seed: int) -> bytes:
  return bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(nbytes))

@pytest.mark.parametrize("nbytes", [4, 1000, 3 << 20])
def test_copy_queue_copies_bytes_through_device_memory_then_signals(ember_device, nbytes):
  dev = _hcq_device(ember_device)
  data = _pattern(nbytes, 1)
  src, dst, (done,) = _host_bytes(dev, data), _host_bytes(dev, bytes(nbytes)), _signals(dev, 1)
  mid = dev.allocator.alloc(nbytes)  # device memory between the two copies
  q = dev.copy_queue().copy(mid.va_addr, src.va_addr, nbytes).memory_barrier().copy(dst.va_addr, mid.va_addr, nbytes)
  assert q.signal(done, 1).submit(dev) is q
  done.wait(1)
  assert done.value == 1
  assert _read(dst, nbytes) == data
  dev.allocator.free(mid, nbytes)

def test_a_queue_waits_for_its_signal_before_it_copies(ember_device):
  dev = _hcq_device(ember_device)
  nbytes = 4096
  data = _pattern(nbytes, 2)
  src, dst = _host_bytes(dev, data), _host_bytes(dev, bytes(nbytes))
  gate, done, other = _signals(dev, 3)
  dev.copy_queue().wait(gate, 5).copy(dst.va_addr, src.va_addr, nbytes).signal(done, 7).submit(dev)
  dev.compute_queue().signal(other, 1).submit(dev)  # independent work still runs while the copy queue is blocked
  other.wait(1)
  assert done.value == 0 and _read(dst, nbytes) == bytes(nbytes), "the copy ran before the signal it waits on"
  dev.compute_queue().signal(gate, 4).submit(dev)  # below the value waited for: the copy queue stays blocked
  dev.compute_queue().signal(other, 2).submit(dev)
  other.wait(2)
  assert done.value == 0, "a wait for >= 5 passed at 4"
  dev.compute_queue().signal(gate, 5).submit(dev)
  done.wait(7)
  assert _read(dst, nbytes) == data

def test_a_submitted_queue_resubmits_with_patched_values(ember_device):
  dev = _hcq_device(ember_device)
  nbytes = 256
  src, dst = _host_bytes(dev, _pattern(nbytes, 3)), _host_bytes(dev, bytes(nbytes))
  gate, done = _signals(dev, 2)
  q = dev.copy_queue().wait(gate, 1).copy(dst.va_addr, src.va_addr, nbytes).signal(done, 1)
  gate.value = 1
  q.submit(dev)
  done.wait(1)
  assert _read(dst, nbytes) == _pattern(nbytes, 3)
  ctypes.memmove(src.va_addr, _pattern(nbytes, 4), nbytes)
  q.patch_wait(2).patch_signal(2).submit(dev)
  dev.compute_queue().signal(gate, 2).submit(dev)
  done.wait(2)
  assert _read(dst, nbytes) == _pattern(nbytes, 4)

@pytest.mark.parametrize("engine", ["compute", "copy"])
def test_timestamps_are_ordered_within_and_across_submissions(ember_device, engine):
  dev = _hcq_device(ember_device)
  queue = dev.compute_queue if engine == "compute" else dev.copy_queue
  t0, t1, t2, done = _signals(dev, 4)
  nbytes = 1 << 20
  src, dst = _host_bytes(dev, _pattern(nbytes, 5)), _host_bytes(dev, bytes(nbytes))
  first = queue().timestamp(t0)
  if engine == "copy": first.copy(dst.va_addr, src.va_addr, nbytes)
  first.timestamp(t1).signal(done, 1).submit(dev)
  done.wait(1)
  queue().timestamp(t2).signal(done, 2).submit(dev)
  done.wait(2)
  stamps = [t0.value, t1.value, t2.value]
  assert stamps[0] > 0, f"{engine} queue wrote no timestamp"
  assert stamps == sorted(stamps), f"{engine} queue timestamps go backwards: {stamps}"
  if engine == "copy": assert _read(dst, nbytes) == _pattern(nbytes, 5)

def test_the_timeline_orders_a_copy_in_and_a_copy_out(ember_device):
  """The allocator's own path: host -> device on the copy queue, device -> host after the timeline says it is done."""
  dev = _hcq_device(ember_device)
  data = _pattern(5000, 6)
  buf = dev.allocator.alloc(len(data))
  before = dev.timeline_value
  dev.allocator._copyin(buf, memoryview(data))
  out = bytearray(len(data))
  dev.allocator._copyout(memoryview(out), buf)
  assert bytes(out) == data
  assert dev.timeline_value > before and dev.timeline_signal.value == dev.timeline_value - 1
  dev.allocator.free(buf, len(data))
