"""Data-parallel Fashion-MNIST over MPI ranks: every rank trains the same MLP on its slice of each global batch and
ember.distributed averages the gradients after backward(), so all ranks take the same Adam step. The test accuracy
matches one process training on the whole batch (up to float rounding in the gradient sums).

  DEV=CPU python examples/mnist_data_parallel.py --limit 12000                                # 1 process
  DEV=CPU mpirun --allow-run-as-root --oversubscribe -n 2 python examples/mnist_data_parallel.py --limit 12000

Needs the Debian package dataset-fashion-mnist, mpi4py and a system MPI (apt-get install -y openmpi-bin
libopenmpi-dev; pip install mpi4py).
"""
from __future__ import annotations
import argparse
import sys
import time
import numpy as np
from ember import Tensor
from ember import distributed as dist
from ember.nn import Linear
from ember.nn.datasets import fashion_mnist
from ember.nn.functional import cross_entropy
from ember.nn.optim import Adam
from ember.nn.state import get_parameters

class MLP:
  """784 -> 128 -> 10 with ReLU."""
  def __init__(self) -> None:
    self.l1, self.l2 = Linear(784, 128), Linear(128, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x.flatten(1)).relu())

def evaluate(model: MLP, images: np.ndarray, labels: np.ndarray) -> float:
  """Accuracy over the test set, each rank scoring its slice; the correct counts are summed across ranks."""
  part = dist.shard_indices(len(images))
  correct = 0
  for start in range(part.start, part.stop, 1000):
    stop = min(start + 1000, part.stop)
    correct += int((model(Tensor(images[start:stop])).numpy().argmax(-1) == labels[start:stop]).sum())
  return float(dist.allreduce_numpy(np.array([correct], dtype=np.int64), "sum")[0]) / len(images)

def train(args: argparse.Namespace) -> dict[str, float]:
  rank, world = dist.init()
  if args.batch_size % world:
    raise SystemExit(f"--batch-size {args.batch_size} must divide evenly over {world} ranks (equal local batches keep "
                     "the averaged gradient equal to the whole-batch gradient)")
  x_train, y_train, x_test, y_test = fashion_mnist(args.data)
  if args.limit: x_train, y_train = x_train[:args.limit], y_train[:args.limit]
  mean, std = float(x_train.mean()) / 255.0, float(x_train.std()) / 255.0
  def prep(images: np.ndarray) -> np.ndarray: return ((images.astype(np.float32) / 255.0) - mean) / std
  train_x, test_x = prep(x_train), prep(x_test)
  Tensor.manual_seed(args.seed)
  model = MLP()
  params = get_parameters(model)
  dp = dist.DataParallel(params)
  dp.broadcast_parameters()  # the same start on every rank, whatever each rank's RNG did
  opt = Adam(params, lr=args.lr)
  local = args.batch_size // world
  start = time.perf_counter()
  for epoch in range(args.epochs):
    order = np.random.default_rng(args.seed + epoch).permutation(len(train_x))  # the same order on every rank
    for step, first in enumerate(range(0, len(order) - args.batch_size + 1, args.batch_size)):
      idx = order[first + rank * local:first + (rank + 1) * local]  # this rank's slice of the global batch
      opt.zero_grad()
      loss = cross_entropy(model(Tensor(train_x[idx])), Tensor(y_train[idx].astype(np.int32)))
      loss.backward()
      dp.sync_gradients()
      opt.step()
      if rank == 0 and (step + 1) % args.log_every == 0:
        print(f"epoch {epoch + 1} step {step + 1}  local loss {loss.item():.4f}", flush=True)
  train_time = time.perf_counter() - start
  acc = evaluate(model, test_x, y_test)
  if rank == 0:
    print(f"{world} rank(s): test accuracy {acc:.4f} after {args.epochs} epoch(s), {train_time:.1f} s", flush=True)
  return {"accuracy": acc, "train_seconds": train_time}

def main(argv: list[str] | None = None) -> dict[str, float]:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch-size", type=int, default=128, help="the global batch, split evenly over the ranks")
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all 60000)")
  parser.add_argument("--log-every", type=int, default=50)
  parser.add_argument("--data", default=None, help="folder of the four *-ubyte.gz files (default: the Debian package)")
  return train(parser.parse_args(argv))

if __name__ == "__main__":
  sys.exit(0 if main() else 1)
