"""Random numbers: Threefry-2x32 over a per-device RNG state buffer that each draw advances inside the graph, so eager
runs, TinyJit replays and several devices all draw fresh, reproducible numbers."""
from __future__ import annotations
import gc
import numpy as np
import pytest
from ember import Tensor, TinyJit, dtypes
import ember.tensor as tensor_module

@pytest.fixture(autouse=True)
def _eval_mode_after():
  yield
  Tensor.training = False

# Random123's known-answer vectors for threefry2x32, 20 rounds: (counter, key) -> output
KAT = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
       ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
       ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0))]

def test_threefry2x32_matches_the_known_answers():
  u32 = lambda *v: Tensor(np.array(v, np.uint32))  # noqa: E731
  ctr0, ctr1 = u32(*(c[0] for c, _, _ in KAT)), u32(*(c[1] for c, _, _ in KAT))
  key0, key1 = u32(*(k[0] for _, k, _ in KAT)), u32(*(k[1] for _, k, _ in KAT))
  x0, x1 = Tensor._threefry2x32((key0, key1), (ctr0, ctr1))
  assert x0.tolist() == [out[0] for _, _, out in KAT]
  assert x1.tolist() == [out[1] for _, _, out in KAT]

def _draws() -> list[Tensor]:
  """One of each random op; dropout only draws while training."""
  return [Tensor.rand(3, 4).realize(), Tensor.randn(5).realize(), Tensor.randint(6, low=0, high=1000).realize(),
          Tensor.ones(8, 8).dropout(0.5).realize(), Tensor.uniform(4, low=-2.0, high=2.0).realize()]

def test_random_ops_under_tinyjit_draw_fresh_values_equal_to_eager():
  Tensor.training = True
  Tensor.manual_seed(11)
  eager = [[t.numpy() for t in _draws()] for _ in range(7)]
  Tensor.manual_seed(11)
  jitted = TinyJit(_draws)
  # calls 1 and 2 run the function (plain run, capture) and draw like eager calls; 3..7 are replays
  replayed = [[t.numpy().copy() for t in jitted()] for _ in range(7)]
  assert jitted.cnt == 7 and jitted.captured
  for op in range(len(eager[0])):
    for call in range(7): np.testing.assert_array_equal(replayed[call][op], eager[call][op])
    replays = [replayed[call][op].tobytes() for call in range(2, 7)]
    assert len(set(replays)) == 5, f"op {op} repeated a value over 5 replays"

def test_pruned_jit_keeps_the_draws():
  Tensor.manual_seed(2)
  eager = [Tensor.rand(16).numpy() for _ in range(5)]
  Tensor.manual_seed(2)
  jitted = TinyJit(lambda: Tensor.rand(16).realize(), prune=True)
  for want in eager: np.testing.assert_array_equal(jitted().numpy(), want)

def test_manual_seed_restarts_captured_draws():
  f = TinyJit(lambda x: (x + Tensor.rand(6)).realize())
  x = Tensor(np.zeros(6, np.float32)).realize()
  for _ in range(3): f(x)
  Tensor.manual_seed(99)
  first = [f(x).numpy().copy() for _ in range(3)]
  Tensor.manual_seed(99)
  again = [Tensor.rand(6).numpy() for _ in range(3)]
  for a, b in zip(first, again): np.testing.assert_array_equal(a, b)

def test_each_device_has_its_own_stream_and_seed_resets_all():
  Tensor.manual_seed(4)
  # a second device of core's own (this suite runs without the CPU backend in tests-core)
  cpu = [Tensor.rand(5, device="PYTHON:1").numpy() for _ in range(2)]
  py = [Tensor.rand(5, device="PYTHON").numpy() for _ in range(2)]
  assert not np.array_equal(cpu[0], cpu[1]) and not np.array_equal(py[0], py[1])
  np.testing.assert_array_equal(cpu[0], py[0])  # same seed, same draw number: the same stream on each device
  Tensor.manual_seed(4)
  np.testing.assert_array_equal(Tensor.rand(5, device="PYTHON").numpy(), py[0])
  np.testing.assert_array_equal(Tensor.rand(5, device="PYTHON:1").numpy(), cpu[0])

def test_seeds_above_32_bits_give_different_streams():
  Tensor.manual_seed(1)
  low = Tensor.rand(64).numpy()
  Tensor.manual_seed(1 + (1 << 32))
  assert not np.array_equal(Tensor.rand(64).numpy(), low)

def test_eager_draws_keep_one_state_buffer_per_device():
  Tensor.rand(4).realize()
  gc.collect()
  before = len(tensor_module.all_tensors)
  for _ in range(20): Tensor.rand(4).numpy()
  gc.collect()
  assert len(tensor_module.all_tensors) == before
  assert set(tensor_module._rng_states) <= {"CPU", "PYTHON", "PYTHON:1"}
  assert all(t.shape == (3,) and t.dtype is dtypes.uint32 for t in tensor_module._rng_states.values())

def test_distributions():
  Tensor.manual_seed(7)
  u = Tensor.rand(20000).numpy()
  assert u.min() >= 0.0 and u.max() < 1.0
  assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
  # consecutive draws are uncorrelated, and so are neighbouring elements
  v = Tensor.rand(20000).numpy()
  assert abs(np.corrcoef(u, v)[0, 1]) < 0.03 and abs(np.corrcoef(u[1:], u[:-1])[0, 1]) < 0.03
  counts = np.bincount(Tensor.randint(50000, low=0, high=10).numpy(), minlength=10)
  chi2 = ((counts - 5000) ** 2 / 5000).sum()
  assert counts.size == 10 and chi2 < 27.9  # p = 0.001 for 9 degrees of freedom
  n = Tensor.randn(20000).numpy()
  assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03

def test_draws_on_several_devices_under_tinyjit():
  devs = ("PYTHON", "PYTHON:1")
  Tensor.manual_seed(8)
  eager = [Tensor.rand(4, device=devs).numpy() for _ in range(5)]
  Tensor.manual_seed(8)
  jitted = TinyJit(lambda: Tensor.rand(4, device=devs).realize())
  for want in eager:
    got = jitted()
    assert got.device == devs
    for shard in got.shards: np.testing.assert_array_equal(shard.numpy(), want)  # every copy holds the draw
  assert len({w.tobytes() for w in eager}) == 5
