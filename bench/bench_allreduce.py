"""Allreduce bandwidth across 2 local MPI ranks: ember.distributed.allreduce on a realized Tensor against mpi4py's
MPI_Allreduce on numpy buffers of the same size, in the same run (same ranks, same sizes, interleaved).

  python bench/bench_allreduce.py          # relaunches itself under mpirun -n 2
  mpirun -n 2 python bench/bench_allreduce.py

Bandwidth is the algorithm bandwidth: bytes of the buffer / time per allreduce (median of the repeats). ember's
figure includes reading the tensor to host memory and building the result Tensor on the device.
"""
from __future__ import annotations
import os
import shutil
import subprocess
import sys
import time
import numpy as np

SIZES = [2 ** k for k in (10, 14, 18, 20, 22, 24)]  # bytes of float32

def _timed(fn, repeats: int) -> float:
  from ember import distributed as dist
  times = []
  for _ in range(repeats):
    dist.barrier()
    st = time.perf_counter()
    fn()
    times.append(time.perf_counter() - st)
  return float(np.median(times))

def run() -> None:
  from mpi4py import MPI
  from ember import distributed as dist
  from ember.tensor import Tensor
  rank, world = dist.init()
  comm = MPI.COMM_WORLD
  if rank == 0:
    print(f"allreduce(sum) of float32 across {world} local ranks (median time, algorithm bandwidth)", flush=True)
    header = ("bytes", "ember ms", "ember GB/s", "MPI ms", "MPI GB/s", "ember/MPI")
    print(" ".join(f"{h:>11s}" for h in header), flush=True)
  for nbytes in SIZES:
    n = nbytes // 4
    host = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    out = np.empty_like(host)
    t = Tensor(host).realize()
    repeats = 20 if nbytes <= 2 ** 20 else 5
    ember_res = dist.allreduce(t)  # warm up both paths, and check they agree
    comm.Allreduce(host, out, op=MPI.SUM)
    if not np.allclose(ember_res.numpy(), out, rtol=1e-6):
      raise RuntimeError(f"ember and MPI allreduce differ at {nbytes} bytes")
    t_ember = _timed(lambda t=t: dist.allreduce(t), repeats)
    t_mpi = _timed(lambda host=host, out=out: comm.Allreduce(host, out, op=MPI.SUM), repeats)
    if rank == 0:
      row = (t_ember * 1e3, nbytes / t_ember / 1e9, t_mpi * 1e3, nbytes / t_mpi / 1e9, t_mpi / t_ember)
      print(f"{nbytes:11d} " + " ".join(f"{v:11.3f}" for v in row), flush=True)

def main() -> int:
  if any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
    run()
    return 0
  mpirun = shutil.which("mpirun")
  try: import mpi4py  # noqa: F401
  except ImportError: mpirun = None
  if mpirun is None:
    print("bench_allreduce: skipped, needs mpirun and mpi4py "
          "(apt-get install -y openmpi-bin libopenmpi-dev; pip install mpi4py)")
    return 0
  cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, os.path.abspath(__file__)]
  return subprocess.run(cmd, timeout=600).returncode

if __name__ == "__main__":
  sys.exit(main())
