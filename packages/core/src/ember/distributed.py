"""Multi-host ember: one process per rank, collectives through MPI (mpi4py over the system MPI, e.g. OpenMPI).

Launch with ``mpirun -n 4 python train.py``. Each rank runs the same program on its own device and its own slice of
the data; `DataParallel` averages the gradients across ranks after `backward()`, so every rank applies the same update
and the parameters stay equal. Collectives move realized tensors through host memory (numpy buffers handed to MPI).

Every wait is bounded: a collective that has not completed after `DIST_TIMEOUT` seconds (env or `Context`, default
300) raises `DistributedError` naming the operation and the rank, instead of hanging on a dead or stuck peer. `init()`
also makes an uncaught exception on any rank abort the whole job (MPI_Abort), so the other ranks end too.

>>> from ember import distributed as dist  # doctest: +SKIP
>>> dist.init(); dist.allreduce(Tensor([float(dist.rank())])).item()  # doctest: +SKIP
1.0
"""
from __future__ import annotations
import os
import sys
import time
from types import TracebackType
from typing import Any, Sequence
import numpy as np
from ember.device import Device
from ember.dtype import dtypes, strong_dtype
from ember.errors import EmberError
from ember.helpers import ContextVar, prod
from ember.tensor import Tensor
from ember.uop.ops import int_shape

DIST_TIMEOUT = ContextVar("DIST_TIMEOUT", 300.0)

class DistributedError(EmberError, RuntimeError):
  """MPI is missing, a collective timed out (a rank died or is stuck), or ranks disagree about shapes."""

_OPS = ("sum", "max", "min", "prod", "mean")

def _mpi() -> Any:
  try:
    from mpi4py import MPI
  except ImportError as e:
    raise DistributedError(f"ember.distributed needs mpi4py over a system MPI ({e}); fix: apt-get install openmpi-bin "
                           "libopenmpi-dev && pip install mpi4py, then launch with mpirun -n N python script.py") from e
  return MPI

def comm() -> Any:
  """The MPI communicator of all ranks (COMM_WORLD)."""
  return _mpi().COMM_WORLD

def rank() -> int:
  """This process's rank, 0 .. world_size()-1."""
  return int(comm().Get_rank())

def world_size() -> int:
  """How many ranks the job has (1 when not launched through mpirun)."""
  return int(comm().Get_size())

_hook_installed = False

def init() -> tuple[int, int]:
  """Start MPI (mpi4py initialises it on import) and make an uncaught exception on any rank abort the whole job, so
  the other ranks never wait on a rank that is gone. Returns (rank, world_size)."""
  global _hook_installed
  world = comm()
  if not _hook_installed and world.Get_size() > 1:
    previous = sys.excepthook
    def abort_job(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
      previous(kind, value, tb)
      sys.stderr.flush()
      world.Abort(1)
    sys.excepthook = abort_job
    _hook_installed = True
  return int(world.Get_rank()), int(world.Get_size())

def _wait(request: Any, what: str) -> None:
  """Complete a non-blocking MPI request, or raise once DIST_TIMEOUT seconds pass."""
  timeout = float(DIST_TIMEOUT.value)
  start = time.monotonic()
  pause = 0.0
  # MPI progresses (e.g. moves shared-memory fragments) only inside Test: poll with yields for the first second, then
  # back off so a rank waiting on a slow peer leaves the CPU to it
  while not request.Test():
    waited = time.monotonic() - start
    if waited > timeout:
      raise DistributedError(f"{what} on rank {rank()} of {world_size()} timed out after {waited:.1f}s waiting for the "
                             "other ranks: a rank died or is stuck; fix: check the other ranks' output, or raise "
                             "DIST_TIMEOUT for slow steps")
    if waited < 1.0: os.sched_yield()
    else:
      pause = min(max(pause * 2, 1e-4), 1e-2)
      time.sleep(pause)

def _mpi_op(op: str) -> Any:
  if op not in _OPS: raise DistributedError(f"unknown reduce op {op!r}; use one of {', '.join(_OPS)}")
  MPI = _mpi()
  return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]

def _host(t: Tensor) -> np.ndarray:
  """t's values as a host array: a zero-copy view of its buffer where the device's allocator offers one."""
  dt = strong_dtype(t.dtype)
  if dt.fmt is None or 0 in t.shape: return np.ascontiguousarray(t.numpy())
  buf = t.buffer()
  view = buf.as_buffer()
  if view is None: return np.ascontiguousarray(t.numpy())
  Device[buf.device].synchronize()
  return np.frombuffer(view, dtype=dt.fmt, count=buf.size).reshape(int_shape(t.shape, "an MPI collective"))

def _device_result(like: Tensor) -> tuple[Tensor, np.ndarray] | None:
  """A fresh tensor shaped like `like` on its device, with a host view of its memory for MPI to write into; None
  where the device's memory is not host-visible."""
  dt = strong_dtype(like.dtype)
  if dt.fmt is None or 0 in like.shape: return None
  shape = int_shape(like.shape, "an MPI collective")
  out = Tensor.empty(*shape, device=like.device, dtype=dt)
  view = out.buffer().as_buffer()
  if view is None: return None
  return out, np.frombuffer(view, dtype=dt.fmt, count=prod(shape)).reshape(shape)

def _back(arr: np.ndarray, like: Tensor) -> Tensor:
  out = Tensor(np.ascontiguousarray(arr), device=like.device)
  return out if out.dtype is like.dtype else out.cast(like.dtype)

def allreduce_numpy(arr: np.ndarray, op: str = "sum") -> np.ndarray:
  """MPI allreduce of a numpy array (every rank passes the same shape and dtype); `mean` divides by the world size."""
  src = np.ascontiguousarray(arr)
  out = np.empty_like(src)
  _wait(comm().Iallreduce(src, out, op=_mpi_op(op)), f"allreduce({op}) of {src.shape} {src.dtype}")
  if op == "mean":
    out = (out / world_size()).astype(src.dtype) if np.issubdtype(src.dtype, np.floating) else out // world_size()
  return out

def allreduce(t: Tensor, op: str = "sum") -> Tensor:
  """`t` reduced over all ranks with `op` (sum, max, min, prod, mean); every rank gets the result on t's device.
  Where the device memory is host-visible (CPU, PYTHON) MPI reads and writes the buffers in place."""
  src = _host(t)
  result = _device_result(t) if op != "mean" else None
  if result is None: return _back(allreduce_numpy(src, op), t)
  out, dst = result
  _wait(comm().Iallreduce(src, dst, op=_mpi_op(op)), f"allreduce({op}) of {src.shape} {src.dtype}")
  return out

def allgather(t: Tensor, axis: int = 0) -> Tensor:
  """Every rank's `t` concatenated along `axis` in rank order (the ranks' shapes may differ only along `axis`)."""
  arr = _host(t)
  ax = axis % max(arr.ndim, 1)
  moved = np.ascontiguousarray(np.moveaxis(arr, ax, 0)) if arr.ndim else arr.reshape(1)
  world = comm()
  counts_out = np.empty(world.Get_size(), dtype=np.int64)
  _wait(world.Iallgather(np.array([moved.size], dtype=np.int64), counts_out), "allgather of the piece sizes")
  counts = [int(c) for c in counts_out]
  inner = moved.shape[1:]
  if any(c % max(int(np.prod(inner)), 1) for c in counts):
    raise DistributedError(f"allgather along axis {axis}: rank {rank()} has trailing shape {inner}, other ranks' sizes "
                           f"{counts} do not fit it; every rank must agree on the dims other than {axis}")
  out = np.empty(sum(counts), dtype=moved.dtype)
  displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
  _wait(world.Iallgatherv(moved.reshape(-1), [out, (counts, [int(d) for d in displs])]),
        f"allgather of {arr.shape} {arr.dtype}")
  gathered = np.moveaxis(out.reshape(-1, *inner), 0, ax) if arr.ndim else out
  return _back(np.ascontiguousarray(gathered), t)

def broadcast(t: Tensor, root: int = 0) -> Tensor:
  """Rank `root`'s `t` on every rank (each rank passes a tensor of the same shape and dtype)."""
  arr = _host(t).copy()
  _wait(comm().Ibcast(arr, root=root), f"broadcast of {arr.shape} {arr.dtype} from rank {root}")
  return _back(arr, t)

def barrier() -> None:
  """Wait until every rank arrives (bounded by DIST_TIMEOUT)."""
  _wait(comm().Ibarrier(), "barrier")

def shard_indices(n: int, rank_: int | None = None, world: int | None = None) -> slice:
  """This rank's contiguous slice of `n` samples (balanced: sizes differ by at most one)."""
  r, w = rank() if rank_ is None else rank_, world_size() if world is None else world
  base, extra = divmod(n, w)
  start = r * base + min(r, extra)
  return slice(start, start + base + (1 if r < extra else 0))

class DataParallel:
  """Keep `params` equal on every rank: `broadcast_parameters()` once at the start, `sync_gradients()` after each
  `backward()` (averages every `.grad` across ranks in one MPI call per dtype), then step any optimizer.

  >>> dp = DataParallel(get_parameters(model))  # doctest: +SKIP
  >>> loss.backward(); dp.sync_gradients(); opt.step()  # doctest: +SKIP
  """
  def __init__(self, params: Sequence[Tensor]):
    if not params: raise DistributedError("DataParallel got no parameters")
    self.params = list(params)
    self.rank, self.world_size = init()

  def broadcast_parameters(self, root: int = 0) -> None:
    """Overwrite every rank's parameters with rank `root`'s (one MPI broadcast per parameter)."""
    for p in self.params: p.assign(broadcast(p.detach(), root)).realize()

  def sync_gradients(self) -> None:
    """Replace each parameter's gradient by its mean over all ranks. A parameter without a gradient on this rank
    contributes zeros (every rank must take part in the same collective)."""
    groups: dict[np.dtype, list[int]] = {}
    host = []
    for i, p in enumerate(self.params):
      g = p.grad if p.grad is not None else Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device)
      arr = _host(g if dtypes.is_float(g.dtype) else g.cast(dtypes.float32))
      host.append(arr)
      groups.setdefault(arr.dtype, []).append(i)
    for dt, idx in groups.items():
      flat = np.concatenate([host[i].reshape(-1) for i in idx]) if len(idx) > 1 else host[idx[0]].reshape(-1)
      mean = allreduce_numpy(flat, "mean").astype(dt)
      offset = 0
      for i in idx:
        n = host[i].size
        p = self.params[i]
        p.grad = _back(mean[offset:offset + n].reshape(host[i].shape), p)
        offset += n
