"""Train a small CNN with BatchNorm on Fashion-MNIST with Adam and a TinyJit-compiled step, then report the test
accuracy, save the model as safetensors, load it into a fresh model and check it scores the same.

  DEV=CPU python examples/train_fashion_mnist.py                  # 2 epochs, batch 128, Adam 2e-3
  DEV=CPU python examples/train_fashion_mnist.py --epochs 1 --limit 6000 --checkpoint /tmp/fmnist.safetensors

Needs the Debian package dataset-fashion-mnist (`apt-get install -y dataset-fashion-mnist`). A tqdm progress bar
shows the loss and the throughput when tqdm is installed; without it a line is printed every `--log-every` steps.
"""
from __future__ import annotations
import argparse
import os
import sys
import tempfile
import time
from typing import Any, Iterable, Iterator
import numpy as np
from ember import Tensor
from ember.nn import BatchNorm1d, BatchNorm2d, Conv2d, Linear
from ember.nn.datasets import batches, fashion_mnist
from ember.nn.optim import Adam, jit_train_step
from ember.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

class SmallCNN:
  """conv(1->16, 3x3) ReLU max-pool BatchNorm2d, linear(16*14*14 -> 128) BatchNorm1d ReLU, linear(128 -> 10).

  One convolution: on the CPU backend a second conv layer (and BatchNorm straight on a conv output, which the
  scheduler recomputes the conv for) costs several times more per step on 2 cores; this size reaches 90% in 2
  epochs in about ten minutes there."""
  def __init__(self, classes: int = 10):
    self.conv, self.bn_conv = Conv2d(1, 16, 3, padding=1), BatchNorm2d(16)
    self.fc, self.bn_fc = Linear(16 * 14 * 14, 128), BatchNorm1d(128)
    self.head = Linear(128, classes)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.conv(x).relu().max_pool2d(2).contiguous()  # (B, 16, 14, 14), materialised once for BatchNorm's passes
    x = self.bn_conv(x).flatten(1)  # (B, 3136)
    return self.head(self.bn_fc(self.fc(x)).relu())

def progress(steps: Iterable[Any], total: int, enabled: bool) -> Any:
  """A tqdm bar over `steps` when tqdm is installed and `enabled`; None otherwise (the caller prints instead)."""
  if not enabled: return None
  try: from tqdm import tqdm
  except ImportError: return None
  return tqdm(steps, total=total, unit="step", dynamic_ncols=True)

def accuracy(model: SmallCNN, x: np.ndarray, y: np.ndarray, batch_size: int = 1000) -> float:
  """The fraction of images whose largest logit is at the label (eval mode: BatchNorm uses running statistics)."""
  prev, Tensor.training = Tensor.training, False
  try: preds = [model(xb).numpy().argmax(-1) for xb, _ in batches(x, y, batch_size)]
  finally: Tensor.training = prev
  return float((np.concatenate(preds) == y).mean())

def train(args: argparse.Namespace) -> dict[str, float]:
  x_train, y_train, x_test, y_test = fashion_mnist(args.data)
  if args.limit: x_train, y_train = x_train[:args.limit], y_train[:args.limit]
  # (N, 1, 28, 28) float32, normalised with the training set's mean and std
  mean, std = float(x_train.mean()) / 255.0, float(x_train.std()) / 255.0
  def prep(images: np.ndarray) -> np.ndarray: return ((images[:, None].astype(np.float32) / 255.0) - mean) / std
  train_x, test_x = prep(x_train), prep(x_test)
  Tensor.manual_seed(args.seed)
  model = SmallCNN()
  opt = Adam(get_parameters(model), lr=args.lr)

  step = jit_train_step(model, opt)  # zero_grad, cross-entropy, backward, step; compiled once

  steps_per_epoch = len(train_x) // args.batch_size
  start = time.perf_counter()
  seen = 0
  Tensor.training = True
  for epoch in range(args.epochs):
    stream: Iterator[tuple[Tensor, Tensor]] = batches(train_x, y_train, args.batch_size, shuffle=True,
                                                      seed=args.seed + epoch, drop_last=True)
    bar = progress(stream, steps_per_epoch, not args.no_progress)
    if bar is not None: bar.set_description(f"epoch {epoch + 1}/{args.epochs}")
    for i, (xb, yb) in enumerate(bar if bar is not None else stream):
      loss = step(xb, yb).item()
      seen += args.batch_size
      rate = seen / (time.perf_counter() - start)
      if bar is not None: bar.set_postfix(loss=f"{loss:.3f}", img_s=f"{rate:.0f}")
      elif (i + 1) % args.log_every == 0:
        print(f"epoch {epoch + 1} step {i + 1}/{steps_per_epoch}  loss {loss:.4f}  {rate:.0f} img/s", flush=True)
    if bar is not None: bar.close()
  Tensor.training = False
  train_time = time.perf_counter() - start
  acc = accuracy(model, test_x, y_test)
  print(f"test accuracy {acc:.4f} after {args.epochs} epochs; training took {train_time:.1f} s "
        f"({seen / train_time:.0f} img/s)")
  # checkpoint round trip: save, load into a fresh model, and score it again
  checkpoint = args.checkpoint or os.path.join(tempfile.mkdtemp(prefix="ember-fmnist-"), "model.safetensors")
  safe_save(get_state_dict(model), checkpoint)
  restored = SmallCNN()
  load_state_dict(restored, safe_load(checkpoint))
  restored_acc = accuracy(restored, test_x, y_test)
  print(f"checkpoint {checkpoint}: reloaded model test accuracy {restored_acc:.4f}")
  if restored_acc != acc: raise RuntimeError(f"reloaded model scores {restored_acc}, the trained one {acc}")
  return {"accuracy": acc, "train_seconds": train_time, "total_seconds": time.perf_counter() - start}

def main(argv: list[str] | None = None) -> dict[str, float]:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--lr", type=float, default=2e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all 60000)")
  parser.add_argument("--log-every", type=int, default=100, help="print every N steps when there is no progress bar")
  parser.add_argument("--no-progress", action="store_true", help="plain prints instead of a tqdm bar")
  parser.add_argument("--checkpoint", default=None, help="where to save the model (default: a temporary folder)")
  parser.add_argument("--data", default=None, help="folder of the four *-ubyte.gz files (default: the Debian package)")
  return train(parser.parse_args(argv))

if __name__ == "__main__":
  sys.exit(0 if main() else 1)
