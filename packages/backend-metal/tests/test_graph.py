"""The JIT graph: `MetalGraph` builds one indirect command buffer for a TinyJit capture and replays it, checked call
by call against the recording libobjc (`objc_fake.py`); and the core hook that hands a capture to a device's graph,
checked on the PYTHON device against numpy."""
from __future__ import annotations
import ctypes
from typing import Any
import numpy as np
import pytest
from ember.codegen import get_program
from ember.device import Device
from ember.engine.realize import CompiledRunner
from ember.plugin import AxisType, DeviceError, Ops, ProgramSpec, UOp, dtypes
from ember.tensor import Tensor
from ember import TinyJit
from ember_metal.device import MTL_CONSTANT_OFFSET_ALIGNMENT, MetalBuffer, MetalDevice, MetalGraph, MetalProgram
from ember_metal.objc import MetalContext, ObjC
from ember_metal.renderer import MetalRenderer
from objc_fake import RecordingDispatch, RecordingLibObjC

DEVICE_HANDLE = 0x500

class HeldBuffer:
  """An ember Buffer as MetalGraph sees it: allocated, with an MTLBuffer (or a view of one) as its handle."""
  def __init__(self, buf: MetalBuffer) -> None:
    self._buf = buf
  def ensure_allocated(self) -> HeldBuffer: return self

def _elementwise_spec() -> ProgramSpec:
  """(x * 2 + 1).relu() over 1000 floats: several threadgroups."""
  x = Tensor(np.zeros((10, 100), np.float32), device="PYTHON")
  items = [it for it in ((x * 2 + 1).relu()).schedule() if it.kind == "kernel"]
  assert len(items) == 1 and items[0].ast is not None
  return get_program(items[0].ast, MetalRenderer())

def _var_spec() -> ProgramSpec:
  """out[i] = n * sum(in[i*8 + j] for j < n): a kernel with a DEFINE_VAR bound as `constant int& n`."""
  n = UOp.variable("n", 1, 8)
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(6), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(48), arg=1)
  i, j = UOp.range(6, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.REDUCE)
  total = UOp(Ops.REDUCE, dtypes.float32, (inp.index(i * 8 + j).load(), j), Ops.ADD)
  return get_program(UOp(Ops.SINK, dtypes.void, (out.index(i).store(total * n.cast(dtypes.float32)),)), MetalRenderer())

def _three(size: list[int] | None) -> tuple[int, ...]: return (*(size or []), 1, 1, 1)[:3]

class Setup:
  """A METAL device on the recording libobjc, two programs and a capture: x feeds both kernels."""
  def __init__(self, supports_apple9: bool) -> None:
    self.vars = (ctypes.c_uint8 * MTL_CONSTANT_OFFSET_ALIGNMENT)()
    self.lib = RecordingLibObjC({"supportsFamily:": supports_apple9, "contents": ctypes.addressof(self.vars),
                                 "new": 0xDE5C, "maxTotalThreadsPerThreadgroup": 1024,
                                 "commandBuffer": 0xC0, "retain": 0xCB, "computeCommandEncoder": 0xE0,
                                 "GPUStartTime": 1.0, "GPUEndTime": 1.5})
    self.dev = MetalDevice("METAL", MetalRenderer(), None, MetalContext(ObjC(self.lib), DEVICE_HANDLE,
                                                                         RecordingDispatch()))
    self.specs = [_elementwise_spec(), _var_spec()]
    self.programs = [MetalProgram(self.dev, spec.name, spec.src.encode()) for spec in self.specs]
    self.runners = [CompiledRunner(spec, spec.src.encode(), prg, "METAL")
                    for spec, prg in zip(self.specs, self.programs)]
    self.x, self.y, self.z = (HeldBuffer(MetalBuffer(handle, 4000)) for handle in (0xA0, 0xB0, 0xD0))
    self.x_view = HeldBuffer(MetalBuffer(0xF0, 192, offset=64))
    self.captured: list[tuple[Any, list[Any], dict[str, int]]] = [(self.runners[0], [self.y, self.x], {}),
                                                                   (self.runners[1], [self.z, self.x], {"n": 5})]
    self.lib.calls.clear()

def _build_calls(s: Setup, graph: MetalGraph) -> list[tuple[int, str, tuple[Any, ...]]]:
  """What building the ICB must send, derived from the kernels' specs and buffers."""
  pipes = [prg.pipeline for prg in s.programs]
  (grid0, local0), (grid1, local1) = ((_three(spec.global_size), _three(spec.local_size)) for spec in s.specs)
  descriptor = 0xDE5C
  return [
    (DEVICE_HANDLE, "newBufferWithLength:options:", (MTL_CONSTANT_OFFSET_ALIGNMENT, 0)),
    (s.lib.cls("MTLIndirectCommandBufferDescriptor"), "new", ()),
    (descriptor, "setCommandTypes:", (32,)),
    (descriptor, "setInheritBuffers:", (False,)),
    (descriptor, "setInheritPipelineState:", (False,)),
    (descriptor, "setMaxKernelBufferBindCount:", (31,)),
    (DEVICE_HANDLE, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", (descriptor, 2, 0)),
    (descriptor, "release", ()),
    (graph.icb, "indirectComputeCommandAtIndex:", (0,)),
    (graph.commands[0], "setComputePipelineState:", (pipes[0],)),
    (graph.commands[0], "setKernelBuffer:offset:atIndex:", (0xB0, 0, 0)),
    (graph.commands[0], "setKernelBuffer:offset:atIndex:", (0xA0, 0, 1)),
    (graph.commands[0], "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (grid0, local0)),
    (graph.commands[0], "setBarrier", ()),
    (graph.icb, "indirectComputeCommandAtIndex:", (1,)),
    (graph.commands[1], "setComputePipelineState:", (pipes[1],)),
    (graph.commands[1], "setKernelBuffer:offset:atIndex:", (0xD0, 0, 0)),
    (graph.commands[1], "setKernelBuffer:offset:atIndex:", (0xA0, 0, 1)),
    (graph.var_buffer, "contents", ()),
    (graph.commands[1], "setKernelBuffer:offset:atIndex:", (graph.var_buffer, 0, 2)),
    (graph.commands[1], "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (grid1, local1)),
    (graph.commands[1], "setBarrier", ()),
    (DEVICE_HANDLE, "supportsFamily:", (1009,)),
  ]

def _replay_calls(s: Setup, graph: MetalGraph, resources: tuple[int, ...], icb_fix: bool) -> list[Any]:
  fix = [call for prg in s.programs for call in ((0xE0, "setComputePipelineState:", (prg.pipeline,)),
         (0xE0, "dispatchThreadgroups:threadsPerThreadgroup:", ((0, 0, 0), (0, 0, 0))))] if icb_fix else []
  return [(s.dev.queue, "commandBuffer", ()), (0xC0, "retain", ()), (0xCB, "computeCommandEncoder", ()), *fix,
          (0xE0, "useResources:count:usage:", (resources, len(resources), 3)),
          (0xE0, "executeCommandsInBuffer:withRange:", (graph.icb, (0, 2))),
          (0xE0, "endEncoding", ()), (0xCB, "commit", ())]

@pytest.mark.parametrize("supports_apple9", [False, True])
def test_graph_builds_one_indirect_command_per_kernel(supports_apple9: bool) -> None:
  s = Setup(supports_apple9)
  graph = MetalGraph(s.dev, s.captured, [s.x])
  assert s.lib.calls == _build_calls(s, graph)
  assert len(set(graph.commands)) == 2 and graph.needs_icb_fix == (not supports_apple9)
  # the variable's slot holds the captured value at the width the kernel's signature declares (`constant int&`)
  assert "constant int& n [[buffer(2)]]" in s.specs[1].src
  assert np.frombuffer(bytes(s.vars), np.int32, count=1)[0] == s.captured[1][2]["n"]

@pytest.mark.parametrize("supports_apple9", [False, True])
def test_graph_replay_is_one_command_buffer_and_rebinds_changed_inputs(supports_apple9: bool) -> None:
  s = Setup(supports_apple9)
  graph = MetalGraph(s.dev, s.captured, [s.x])
  s.lib.calls.clear()
  s.lib.pools.clear()
  # same inputs: nothing is rebound, the ICB runs in one command buffer left in flight
  assert graph([s.x]) is None  # type: ignore[list-item]
  icb_fix = not supports_apple9
  assert s.lib.calls == _replay_calls(s, graph, (0xB0, 0xA0, 0xD0, graph.var_buffer), icb_fix)
  assert s.lib.pools == ["push", "pop"] and s.dev.in_flight == [0xCB]
  s.lib.calls.clear()
  # a new input (a view at an offset): wait for the previous replay, rebind x in both commands, then run with the
  # new buffer resident instead of the old one
  assert graph([s.x_view], wait=True) == 0.5  # type: ignore[list-item]
  wait = [(0xCB, "waitUntilCompleted", ()), (0xCB, "status", ()), (0xCB, "GPUEndTime", ()),
          (0xCB, "GPUStartTime", ()), (0xCB, "release", ())]
  rebind = [(graph.commands[0], "setKernelBuffer:offset:atIndex:", (0xF0, 64, 1)),
            (graph.commands[1], "setKernelBuffer:offset:atIndex:", (0xF0, 64, 1))]
  assert s.lib.calls == [*wait, *rebind, *_replay_calls(s, graph, (0xB0, 0xD0, graph.var_buffer, 0xF0), icb_fix),
                         *wait]
  assert s.dev.in_flight == []

def test_graph_keeps_a_buffer_resident_while_another_binding_uses_it() -> None:
  s = Setup(True)
  x_tail = HeldBuffer(MetalBuffer(0xA0, 400, offset=3600))  # another view of x's MTLBuffer, not an input
  s.captured[1] = (s.runners[1], [s.z, x_tail], {"n": 3})
  graph = MetalGraph(s.dev, s.captured, [s.x])
  s.lib.calls.clear()
  graph([s.x_view])  # type: ignore[list-item]
  rebinds = [(r, values) for r, name, values in s.lib.calls if name == "setKernelBuffer:offset:atIndex:"]
  assert rebinds == [(graph.commands[0], (0xF0, 64, 1))]  # only the input's binding moves
  uses = [values for _, name, values in s.lib.calls if name == "useResources:count:usage:"]
  assert sorted(uses[0][0]) == sorted((0xB0, 0xA0, 0xD0, graph.var_buffer, 0xF0))  # x's MTLBuffer is still used

def test_graph_refuses_too_many_bindings_and_other_devices() -> None:
  s = Setup(True)
  many = [HeldBuffer(MetalBuffer(0x100 + i, 4)) for i in range(31)]
  with pytest.raises(DeviceError, match="binds 32 buffers and variables, more than the 31"):
    MetalGraph(s.dev, [(s.runners[1], many, {"n": 1})], [])
  other = Setup(True)
  with pytest.raises(DeviceError, match="batches kernels of METAL only"):
    MetalGraph(other.dev, s.captured, [s.x])

# ** the core hook: a device's `graph` gets the whole capture **

class ReplayingGraph:
  """A device graph that replays the captured runners itself, swapping inputs as the contract says."""
  built: list[ReplayingGraph] = []
  def __init__(self, captured: list[tuple[Any, list[Any], dict[str, int]]], input_buffers: list[Any]) -> None:
    self.captured, self.inputs, self.replays = captured, list(input_buffers), 0
    ReplayingGraph.built.append(self)
  def __call__(self, input_buffers: list[Any]) -> None:
    swap = {id(old): new for old, new in zip(self.inputs, input_buffers)}
    for runner, bufs, var_vals in self.captured: runner([swap.get(id(b), b) for b in bufs], var_vals)
    self.replays += 1

def test_tinyjit_hands_a_capture_to_the_device_graph(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(Device["PYTHON"], "graph", ReplayingGraph)
  ReplayingGraph.built.clear()
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor:
    return ((a @ b).relu() + a.sum()).contiguous()
  rng = np.random.default_rng(3)
  for _ in range(4):
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    out = f(Tensor(a, device="PYTHON").realize(), Tensor(b, device="PYTHON").realize())
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0) + a.sum(), rtol=1e-5, atol=1e-5)
  assert len(ReplayingGraph.built) == 1  # built once, after the capture
  graph = ReplayingGraph.built[0]
  assert graph.replays == 2 and graph.captured is f.captured and len(graph.inputs) == 2
