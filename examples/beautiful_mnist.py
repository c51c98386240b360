"""tinygrad's examples/beautiful_mnist.py on ember: the same program but for `tinygrad` -> `ember` in its imports and
ember's Fashion-MNIST loader (the Debian package) in place of tinygrad's downloader.

  DEV=CPU python examples/beautiful_mnist.py                             # 70 steps at batch 512
  DEV=CPU STEPS=4 BS=32 TEST_EVERY=2 TEST_SIZE=500 python examples/beautiful_mnist.py   # CI's short run

Needs `apt-get install -y dataset-fashion-mnist`. TARGET_EVAL_ACC_PCT=85 fails the run below that test accuracy;
TEST_SIZE scores the first N test images only (default: all 10,000).
"""
from typing import Callable
from ember import Tensor, TinyJit, nn, GlobalCounters, function
from ember.helpers import getenv, colored, trange, Context
from ember.nn.datasets import fashion_mnist

class Model:
  def __init__(self):
    self.layers: list[Callable[[Tensor], Tensor]] = [
      nn.Conv2d(1, 32, 5), Tensor.relu,
      nn.Conv2d(32, 32, 5), Tensor.relu,
      nn.BatchNorm(32), Tensor.max_pool2d,
      nn.Conv2d(32, 64, 3), Tensor.relu,
      nn.Conv2d(64, 64, 3), Tensor.relu,
      nn.BatchNorm(64), Tensor.max_pool2d,
      lambda x: x.flatten(1), nn.Linear(576, 10)]

  @function
  def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)

def mnist() -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """What tinygrad.nn.datasets.mnist(fashion=True) returns: images (N, 1, 28, 28) uint8, labels (N,) uint8."""
  x_train, y_train, x_test, y_test = fashion_mnist()
  test_size = getenv("TEST_SIZE", len(x_test))
  return (Tensor(x_train).reshape(-1, 1, 28, 28), Tensor(y_train),
          Tensor(x_test[:test_size]).reshape(-1, 1, 28, 28), Tensor(y_test[:test_size]))

def main() -> float:
  X_train, Y_train, X_test, Y_test = mnist()

  model = Model()
  opt = nn.optim.Adam(nn.state.get_parameters(model))

  @TinyJit
  @Context(TRAINING=1)
  def train_step() -> Tensor:
    opt.zero_grad()
    samples = Tensor.randint(getenv("BS", 512), high=X_train.shape[0])
    loss = model(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples]).backward()
    return loss.realize(*opt.schedule_step())

  @TinyJit
  def get_test_acc() -> Tensor: return (model(X_test).argmax(axis=1) == Y_test).mean() * 100

  test_acc, test_every = float("nan"), getenv("TEST_EVERY", 10)
  for i in (t := trange(getenv("STEPS", 70))):
    GlobalCounters.reset()  # NOTE: this makes it nice for debugging, but slows down the execution
    loss = train_step()
    if i % test_every == test_every - 1: test_acc = get_test_acc().item()
    t.set_description(f"loss: {loss.item():6.2f} test_accuracy: {test_acc:5.2f}%")

  # verify eval acc
  if target := getenv("TARGET_EVAL_ACC_PCT", 0.0):
    if test_acc >= target and test_acc != 100.0: print(colored(f"{test_acc=} >= {target}", "green"))
    else: raise ValueError(colored(f"{test_acc=} < {target}", "red"))
  return test_acc

if __name__ == "__main__":
  main()
