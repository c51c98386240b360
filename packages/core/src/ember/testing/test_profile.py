"""Tier 7, profiling: a device's kernels show in `ember.profile()` traces with the times DEBUG=2 prints. A device that
times kernels with its own clock (`Compiled.launch_timestamps_ns`, the HCQ timeline's timestamp signals on NV and
AMD, MOCK included) has its kernel events, and its copy queue's copies, placed by those timestamps, moved onto the
host clock of the trace; other devices' kernels are timed on the host."""
from __future__ import annotations
import contextlib
import io
import re
import numpy as np
import pytest
from ember.testing import sample
from ember.testing.trace_format import assert_valid_trace

pytestmark = pytest.mark.ember_tier("profile")

_DEBUG_LINE = re.compile(r"^\*\*\* (\S+)\s+\d+ (\S+)\s+tm\s+([\d.]+)us")

def test_kernel_events_carry_the_devices_times(ember_device, ember_capabilities):
  from ember import Context, Tensor, profile, profiler
  from ember.device import Device
  from ember.dtype import dtypes
  from ember.helpers import ansistrip
  if not ember_capabilities.has_renderer or not ember_capabilities.has_compiler:
    pytest.skip(f"{ember_device} cannot compile kernels")
  if not ember_capabilities.holds_data: pytest.skip(f"{ember_device} holds no data, so it runs no kernels")
  dev = Device[ember_device]
  a, b = (sample((64,), dtypes.float32, seed=seed).astype(np.float32) for seed in (7, 8))
  x, y = Tensor(a, device=ember_device).realize(), Tensor(b, device=ember_device).realize()
  err = io.StringIO()
  start_us = profiler.now_us()
  with contextlib.redirect_stderr(err), Context(DEBUG=2), profile() as p:
    out = ((x * y).contiguous() + 1).sum().realize()
    stamps = dev.launch_timestamps_ns()  # of the last kernel
    result = out.numpy()
  end_us = profiler.now_us()
  np.testing.assert_allclose(result, (a * b + 1).sum(), rtol=1e-5)
  events = p.trace_events()
  assert_valid_trace({"traceEvents": events, "displayTimeUnit": "ms"})
  kernels = [e for e in events if e.get("cat") == "kernel"]
  debug = [(m[2], float(m[3])) for ln in err.getvalue().splitlines() if (m := _DEBUG_LINE.match(ansistrip(ln)))]
  assert len(kernels) >= 2 and [(e["name"], pytest.approx(e["dur"], abs=0.006)) for e in kernels] == debug
  for e in kernels:  # device times moved onto the host clock land inside the profiled block
    assert start_us <= e["ts"] and e["ts"] + e["dur"] <= end_us, (e, start_us, end_us)
  assert [e["ts"] for e in kernels] == sorted(e["ts"] for e in kernels)
  if stamps is None:
    assert all(e["args"]["timer"] == "host" for e in kernels)
    return
  assert all(e["args"]["timer"] == "device" for e in kernels)
  last = kernels[-1]["args"]
  assert (last["device_start_ns"], last["device_end_ns"]) == stamps
  for e in kernels:
    assert e["dur"] == pytest.approx((e["args"]["device_end_ns"] - e["args"]["device_start_ns"]) / 1e3, abs=1e-6)
  # reading the result copies it out on the device's copy queue, which timestamps the copy too
  copies = [e for e in events if e.get("cat") == "copy" and e["args"].get("timer") == "device"]
  assert [e["name"] for e in copies] == [f"device -> host {result.nbytes} B"]
  assert start_us <= copies[0]["ts"] and copies[0]["ts"] + copies[0]["dur"] <= end_us
  assert copies[0]["dur"] == (copies[0]["args"]["device_end_ns"] - copies[0]["args"]["device_start_ns"]) / 1e3
