"""TinyJit's HCQ graph on MOCK+NV: one GPFIFO submission per replay, kernels in capture order, the timeline signal and
per-kernel timestamps written by the command stream; swapped inputs and bound Variables patched in place."""
from __future__ import annotations
import pytest
from ember.testing.hcq_graph import (check_bound_variables_patch_in_place, check_mlp_step_replays_as_one_submission,
                                    check_profiled_replay_is_one_submission)
from ember.testing.hostshim import selected_device

@pytest.fixture(scope="module")
def mock_nv():
  with selected_device("MOCK+NV", "NV") as dev: yield dev

def _launches(dev):
  dev.gpu.launches = []
  def take() -> list[int]:
    ran, dev.gpu.launches = dev.gpu.launches, []
    return ran
  return take

def test_mlp_step_replays_as_one_submission(mock_nv) -> None:
  check_mlp_step_replays_as_one_submission(mock_nv, "NV", _launches(mock_nv), lambda prg: prg.program_address)
  mock_nv.gpu.launches = None

def test_profiled_replay_is_one_submission(mock_nv) -> None:
  check_profiled_replay_is_one_submission(mock_nv, "NV")

def test_bound_variables_are_patched_in_place(mock_nv) -> None:
  check_bound_variables_patch_in_place(mock_nv, "NV")

def test_graph_qmds_outlive_the_qmd_ring(mock_nv) -> None:
  """A graph's QMDs are its own: launches after it that wrap the QMD ring around do not overwrite them."""
  import numpy as np
  from ember import Tensor, TinyJit
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x * 2 + 1).realize()
  for _ in range(3): f(Tensor(np.zeros(8, np.float32), device="NV").realize())
  ring, ptr = mock_nv._qmds, mock_nv._qmd_ptr
  mock_nv._qmds, mock_nv._qmd_ptr = ring.offset(0, 4 * 512), 0  # a ring of 4 QMDs, so that it wraps soon
  try:
    y = Tensor(np.ones(8, np.float32), device="NV").realize()
    for _ in range(8): (y + 1).realize()  # one-off launches: their QMDs come from the ring, which wraps twice
    xn = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(f(Tensor(xn, device="NV").realize()).numpy(), xn * 2 + 1)
  finally: mock_nv._qmds, mock_nv._qmd_ptr = ring, ptr

def test_dropped_graphs_give_their_memory_back(mock_nv, monkeypatch) -> None:
  """Kernel arguments, timestamps and the QMD blocks of a TinyJit's graph are unmapped once the jit is gone: capturing
  and dropping graphs again and again keeps the device's host memory flat."""
  import gc
  import numpy as np
  from ember import Tensor, TinyJit
  live: set[int] = set()
  def counted(alloc):
    def wrapped(size):
      buf = alloc(size)
      live.add(buf.va_addr)
      return buf
    return wrapped
  free = mock_nv._host_free
  def freed(buf) -> None:
    live.discard(buf.va_addr)
    free(buf)
  monkeypatch.setattr(mock_nv, "_host_alloc", counted(mock_nv._host_alloc))
  monkeypatch.setattr(mock_nv, "_command_memory", counted(mock_nv._command_memory))
  monkeypatch.setattr(mock_nv, "_host_free", freed)
  held = []
  for i in range(4):
    @TinyJit
    def f(x: Tensor) -> Tensor: return ((x * 2 + 1).exp2() - x).realize()
    for k in range(3):
      xn = np.full(8, i + k, np.float32)
      np.testing.assert_allclose(f(Tensor(xn, device="NV").realize()).numpy(), np.exp2(xn * 2 + 1) - xn, rtol=1e-6)
    del f
    gc.collect()
    held.append(len(live))
  assert held[1:] == held[:1] * 3, held
