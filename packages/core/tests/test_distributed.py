"""ember.distributed under a real `mpirun` on localhost (2 and 4 ranks): data-parallel training keeps the parameters
equal on every rank and equal to one process training on the whole batch; a dead or stuck rank ends the job with a
clear error inside a timeout. Skips when mpirun or mpi4py is missing (the `multi` nox session installs them)."""
from __future__ import annotations
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
import numpy as np
import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

WORKER = textwrap.dedent('''
  import os, sys, time
  import numpy as np
  from ember import distributed as dist
  from ember.tensor import Tensor

  mode, out_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
  rank, world = dist.init()
  if mode == "die":
    if rank == 1: os._exit(7)  # gone without a word, before the collective
    dist.allreduce(Tensor([1.0]))
  if mode == "stuck":
    if rank == 1: time.sleep(120)
    dist.allreduce(Tensor([1.0]))
  if mode == "collectives":
    x = Tensor(np.full((2, 3), rank + 1, dtype=np.float32))
    got = {"sum": dist.allreduce(x).numpy(), "max": dist.allreduce(x, "max").numpy(),
           "mean": dist.allreduce(x, "mean").numpy(),
           "gather": dist.allgather(Tensor(np.full((rank + 1, 2), rank, dtype=np.int32))).numpy(),
           "bcast": dist.broadcast(Tensor(np.arange(4, dtype=np.float32) * (rank + 5)), root=world - 1).numpy()}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **got)
  if mode == "train":
    rng = np.random.default_rng(0)
    x_all = rng.standard_normal((8, 5)).astype(np.float32)
    y_all = rng.integers(0, 3, 8).astype(np.int32)
    # each rank starts from different weights: broadcast_parameters makes rank 0's the common start
    init = np.random.default_rng(100 + rank)
    w1 = Tensor((init.standard_normal((5, 8)) * 0.5).astype(np.float32)).contiguous().realize()
    w2 = Tensor((init.standard_normal((8, 3)) * 0.5).astype(np.float32)).contiguous().realize()
    dp = dist.DataParallel([w1, w2])
    dp.broadcast_parameters()
    part = dist.shard_indices(8)
    x, y = Tensor(x_all[part]), Tensor(y_all[part])
    losses = []
    for _ in range(steps):
      w1.requires_grad, w2.requires_grad, w1.grad, w2.grad = True, True, None, None
      loss = ((x @ w1).relu() @ w2).sparse_categorical_crossentropy(y)
      loss.backward()
      dp.sync_gradients()
      for w in (w1, w2): w.assign(w.detach() - 0.5 * w.grad)
      w1.realize(w2)
      losses.append(dist.allreduce(loss.detach(), "mean").item())
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), w1=w1.numpy(), w2=w2.numpy(), losses=np.array(losses))
''')

def _mpirun() -> str:
  exe = shutil.which("mpirun")
  if exe is None: pytest.skip("mpirun is not installed (apt-get install -y openmpi-bin libopenmpi-dev)")
  try: import mpi4py  # noqa: F401
  except ImportError: pytest.skip("mpi4py is not installed (pip install mpi4py, after the system MPI)")
  return exe

def _launch(tmp_path: Path, n: int, mode: str, steps: int = 0, timeout: float = 120.0,
            extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
  script = tmp_path / "worker.py"
  script.write_text(WORKER)
  path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
  env = {**os.environ, "DEV": os.environ.get("DEV", "PYTHON"), "PYTHONPATH": path,
         "OMPI_MCA_rmaps_base_oversubscribe": "1", **(extra_env or {})}
  cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), sys.executable, str(script), mode,
         str(tmp_path), str(steps)]
  start = time.monotonic()
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
  return proc, time.monotonic() - start

def _reference_training(steps: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
  """One process, whole batch, no MPI: what every rank must end with."""
  from ember.tensor import Tensor
  rng = np.random.default_rng(0)
  x_all = rng.standard_normal((8, 5)).astype(np.float32)
  y_all = rng.integers(0, 3, 8).astype(np.int32)
  init = np.random.default_rng(100)
  w1 = Tensor((init.standard_normal((5, 8)) * 0.5).astype(np.float32)).contiguous().realize()
  w2 = Tensor((init.standard_normal((8, 3)) * 0.5).astype(np.float32)).contiguous().realize()
  x, y = Tensor(x_all), Tensor(y_all)
  losses = []
  for _ in range(steps):
    w1.requires_grad, w2.requires_grad, w1.grad, w2.grad = True, True, None, None
    loss = ((x @ w1).relu() @ w2).sparse_categorical_crossentropy(y)
    loss.backward()
    assert w1.grad is not None and w2.grad is not None
    for w in (w1, w2): w.assign(w.detach() - 0.5 * w.grad)
    w1.realize(w2)
    losses.append(loss.item())
  return w1.numpy(), w2.numpy(), losses

@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_training_matches_one_process(tmp_path, n):
  steps = 3
  proc, _ = _launch(tmp_path, n, "train", steps)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(n)]
  for r in ranks[1:]:  # every rank applied the same averaged gradient
    np.testing.assert_array_equal(r["w1"], ranks[0]["w1"])
    np.testing.assert_array_equal(r["w2"], ranks[0]["w2"])
  w1, w2, losses = _reference_training(steps)
  np.testing.assert_allclose(ranks[0]["w1"], w1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ranks[0]["w2"], w2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=1e-5)
  assert losses[-1] < losses[0]

def test_collectives_across_ranks(tmp_path):
  n = 2
  proc, _ = _launch(tmp_path, n, "collectives")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for r in range(n):
    got = np.load(tmp_path / f"rank{r}.npz")
    np.testing.assert_array_equal(got["sum"], np.full((2, 3), sum(range(1, n + 1)), np.float32))
    np.testing.assert_array_equal(got["max"], np.full((2, 3), n, np.float32))
    np.testing.assert_allclose(got["mean"], np.full((2, 3), (n + 1) / 2, np.float32))
    np.testing.assert_array_equal(got["gather"], np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)]))
    np.testing.assert_array_equal(got["bcast"], np.arange(4, dtype=np.float32) * (n - 1 + 5))

def test_a_dead_rank_ends_the_job(tmp_path):
  proc, elapsed = _launch(tmp_path, 2, "die", timeout=90)
  assert proc.returncode != 0 and elapsed < 60
  out = proc.stdout + proc.stderr
  assert "exit" in out.lower() and ("rank 1" in out or "non-zero" in out), out

def test_a_stuck_rank_times_out_with_a_clear_error(tmp_path):
  proc, elapsed = _launch(tmp_path, 2, "stuck", timeout=90, extra_env={"DIST_TIMEOUT": "3"})
  assert proc.returncode != 0 and elapsed < 60, proc.stdout + proc.stderr
  assert "DistributedError" in proc.stderr and "timed out" in proc.stderr and "rank 0 of 2" in proc.stderr, proc.stderr

def test_shard_indices_cover_the_data():
  from ember.distributed import shard_indices
  for n in (7, 8, 13):
    for world in (1, 2, 3, 4):
      parts = [shard_indices(n, r, world) for r in range(world)]
      assert np.concatenate([np.arange(n)[p] for p in parts]).tolist() == list(range(n))
