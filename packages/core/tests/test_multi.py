"""Sharded tensors and collectives (ember.multi), checked against numpy on the unsharded data.

PYTHON:0..3 hold data and need no compiler; NULL:0..3 run the same graphs without data (shapes, launches, copies);
CPU:0/CPU:1 run when the CPU backend is installed.
"""
from __future__ import annotations
import numpy as np
import pytest
from ember.errors import DeviceError
from ember.helpers import Context
from ember.multi import MultiTensor, ShardingError, allgather, allreduce, reduce_scatter, split_sizes
from ember.tensor import Tensor
from ember.uop.ops import Ops

PY2 = ("PYTHON", "PYTHON:1")
PY3 = ("PYTHON", "PYTHON:1", "PYTHON:2")
NULL4 = ("NULL", "NULL:1", "NULL:2", "NULL:3")

def _cpu_pair() -> tuple[str, str]:
  from ember.device import Device
  try:
    Device["CPU"], Device["CPU:1"]
  except DeviceError as e: pytest.skip(f"the CPU backend is not installed here: {e}")
  return ("CPU", "CPU:1")

@pytest.fixture(params=["python", "cpu"])
def devs(request: pytest.FixtureRequest) -> tuple[str, ...]:
  return PY2 if request.param == "python" else _cpu_pair()

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

# ** layout **

def test_shard_splits_contiguously_and_round_trips(devs):
  x = _rand(5, 3)
  t = Tensor(x, device=devs[0]).shard(devs, axis=0)
  assert isinstance(t, MultiTensor) and t.shape == (5, 3) and t.axis == 0 and t.devices == devs
  assert [s.shape for s in t.shards] == [(3, 3), (2, 3)] and t.bounds == [(0, 3), (3, 5)]
  np.testing.assert_array_equal(t.numpy(), x)
  np.testing.assert_array_equal(t.shards[1].numpy(), x[3:])
  np.testing.assert_array_equal(t.to(devs[1]).numpy(), x)

def test_replicate_with_to_tuple_and_shard_in_place(devs):
  x = _rand(4)
  r = Tensor(x, device=devs[0]).to(devs)
  assert isinstance(r, MultiTensor) and r.axis is None
  for s in r.shards: np.testing.assert_array_equal(s.numpy(), x)
  t = Tensor(x, device=devs[0])
  same = t.shard_(devs, 0)
  assert same is t and isinstance(t, MultiTensor) and t.axis == 0
  np.testing.assert_array_equal(t.numpy(), x)

def test_split_sizes_are_balanced():
  for n in range(4, 20):
    for ndev in (2, 3, 4):
      sizes = split_sizes(n, ndev)
      assert sum(sizes) == n and max(sizes) - min(sizes) <= 1

def test_kernels_launch_once_per_device():
  t = Tensor.empty(8, 4, device="NULL").shard(NULL4, 0).realize()
  items = [it for it in (t * 2 + 1).schedule() if it.kind == "kernel"]
  assert sorted(it.device for it in items) == sorted(NULL4)

def test_sharded_uop_access_is_a_clear_error():
  t = Tensor(_rand(4), device="PYTHON").shard(PY2, 0)
  with pytest.raises(ShardingError, match="one graph per device"): _ = t.uop

def test_too_few_items_to_shard():
  with pytest.raises(ShardingError, match="fewer than the 3 devices"): Tensor(_rand(2), device="PYTHON").shard(PY3, 0)

# ** elementwise, reduce, movement, matmul **

def test_elementwise_mixed_layouts(devs):
  x, y, z = _rand(6, 4), _rand(6, 4, seed=1), _rand(4, seed=2)
  a = Tensor(x, device=devs[0]).shard(devs, 0)
  b = Tensor(y, device=devs[0]).shard(devs, 1)  # sharded differently: gathered and re-split
  c = Tensor(z, device=devs[0]).to(devs)  # replicated and broadcast
  out = (a * 2 + b).maximum(c) - 1
  assert out.axis == 0
  np.testing.assert_allclose(out.numpy(), np.maximum(x * 2 + y, z) - 1, rtol=1e-6)
  np.testing.assert_allclose((a > 0).where(a, 0.5 * a).numpy(), np.where(x > 0, x, 0.5 * x), rtol=1e-6)
  np.testing.assert_allclose((a + Tensor(y, device=devs[1])).numpy(), x + y, rtol=1e-6)  # a plain tensor is replicated

@pytest.mark.parametrize("ring", [0, 1])
def test_reductions(devs, ring):
  x = _rand(7, 5)
  t = Tensor(x, device=devs[0]).shard(devs, 0)
  with Context(RING=ring):
    np.testing.assert_allclose(t.sum().numpy(), x.sum(), rtol=1e-5)
    np.testing.assert_allclose(t.sum(0).numpy(), x.sum(0), rtol=1e-5)
    np.testing.assert_allclose(t.max(0).numpy(), x.max(0))
    np.testing.assert_allclose(t.min().numpy(), x.min())
    np.testing.assert_allclose(t.mean(1).numpy(), x.mean(1), rtol=1e-5)
    assert t.sum(0).axis is None and t.sum(1).axis == 0
    np.testing.assert_allclose(t.softmax(0).numpy(), np.exp(x) / np.exp(x).sum(0), rtol=1e-5)

def test_movement_follows_the_shard_axis(devs):
  x = _rand(6, 4)
  t = Tensor(x, device=devs[0]).shard(devs, 0)
  cases = {"reshape": (t.reshape(2, 3, 4), x.reshape(2, 3, 4), 0), "flat": (t.reshape(24), x.reshape(24), 0),
           "permute": (t.permute(1, 0), x.T, 1),
           "expand": (t.reshape(6, 1, 4).expand(6, 3, 4), np.broadcast_to(x[:, None], (6, 3, 4)), 0),
           "pad_other": (t.pad(((0, 0), (1, 2))), np.pad(x, ((0, 0), (1, 2))), 0),
           "shrink_other": (t[:, 1:3], x[:, 1:3], 0), "flip_other": (t.flip(1), x[:, ::-1], 0)}
  for name, (got, want, axis) in cases.items():
    assert got.axis == axis, name
    np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
  # ops on the sharded axis gather first (replicated result), or take one whole shard
  np.testing.assert_array_equal(t.pad(((1, 1), (0, 0))).numpy(), np.pad(x, ((1, 1), (0, 0))))
  np.testing.assert_array_equal(t.flip(0).numpy(), x[::-1])
  np.testing.assert_array_equal(t[3:6].numpy(), x[3:6])

def test_movement_across_shard_boundaries_raises():
  t = Tensor(_rand(6, 4), device="PYTHON").shard(PY2, 0)
  with pytest.raises(ShardingError, match="shard boundaries"): t[1:4]
  with pytest.raises(ShardingError, match="moves items between shards"): t.reshape(3, 8)

@pytest.mark.parametrize("layout", ["rows", "inner", "columns"])
def test_sharded_matmul(devs, layout):
  x, w = _rand(6, 8), _rand(8, 5, seed=1)
  ax_x, ax_w = {"rows": (0, None), "inner": (1, 0), "columns": (None, 1)}[layout]
  a, b = Tensor(x, device=devs[0]).shard(devs, ax_x), Tensor(w, device=devs[0]).shard(devs, ax_w)
  out = a @ b
  assert out.axis == {"rows": 0, "inner": None, "columns": 1}[layout]
  np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)

# ** collectives **

@pytest.mark.parametrize("algorithm", ["naive", "ring"])
@pytest.mark.parametrize("devices", [PY2, PY3])
def test_collectives_equal_unsharded(devices, algorithm):
  parts = [_rand(7, 3, seed=i) for i in range(len(devices))]
  ts = [Tensor(p, device=d) for p, d in zip(parts, devices)]
  for op, ref in ((Ops.ADD, np.sum(parts, axis=0)), (Ops.MAX, np.max(parts, axis=0))):
    out = allreduce(op, ts, algorithm=algorithm)
    assert [o.device for o in out] == list(devices)
    results = [o.numpy() for o in out]
    for r in results:
      np.testing.assert_allclose(r, ref, rtol=1e-6)
      np.testing.assert_array_equal(r, results[0])  # replicas are bit-identical
  for d, g in zip(devices, allgather(ts, axis=0, algorithm=algorithm)):
    assert g.device == d
    np.testing.assert_array_equal(g.numpy(), np.concatenate(parts, 0))
  total = np.sum(parts, axis=0)
  starts = np.cumsum([0, *split_sizes(7, len(devices))])
  for i, piece in enumerate(reduce_scatter(Ops.ADD, ts, axis=0, algorithm=algorithm)):
    assert piece.device == devices[i]
    np.testing.assert_allclose(piece.numpy(), total[starts[i]:starts[i + 1]], rtol=1e-6)

def _schedule(ts: list[Tensor]) -> list:
  from ember.schedule import create_schedule
  items, _ = create_schedule([t.uop for t in ts])
  return items

def test_ring_moves_pieces_not_whole_tensors():
  ts = [Tensor.empty(64, device=d) for d in NULL4]
  naive = [it.bufs[0].size for it in _schedule(allreduce(Ops.ADD, ts, algorithm="naive")) if it.kind == "copy"]
  ring = [it.bufs[0].size for it in _schedule(allreduce(Ops.ADD, ts, algorithm="ring")) if it.kind == "copy"]
  assert naive == [64] * (4 * 3)  # every device pulls the 3 others
  assert ring == [16] * (2 * 3 * 4)  # 3 reduce-scatter + 3 allgather steps, 4 quarter-size pieces each

def test_ring_env_selects_the_ring():
  ts = [Tensor.empty(64, device=d) for d in NULL4]
  with Context(RING=1): ring = _schedule(allreduce(Ops.ADD, ts))
  naive = _schedule(allreduce(Ops.ADD, ts))
  assert sum(it.kind == "copy" for it in ring) == 24 and sum(it.kind == "copy" for it in naive) == 12

# ** training **

def _mlp_step(x: Tensor, y: Tensor, w1: Tensor, w2: Tensor, lr: float) -> Tensor:
  loss = ((x @ w1).relu() @ w2).sparse_categorical_crossentropy(y)
  loss.backward()
  for w in (w1, w2):
    assert w.grad is not None
    w.assign(w.detach() - lr * w.grad)
  return loss

def _train(devices: tuple[str, ...] | None, steps: int,
           data: tuple[np.ndarray, ...]) -> tuple[list[float], list[np.ndarray]]:
  x, y, p1, p2 = data
  dev = devices[0] if devices else "PYTHON"
  xs, ys = Tensor(x, device=dev), Tensor(y, device=dev)
  w1, w2 = Tensor(p1, device=dev).contiguous().realize(), Tensor(p2, device=dev).contiguous().realize()
  if devices:
    xs, ys, w1, w2 = xs.shard(devices, 0), ys.shard(devices, 0), w1.to(devices).realize(), w2.to(devices).realize()
  losses = []
  for _ in range(steps):
    w1.requires_grad, w2.requires_grad, w1.grad, w2.grad = True, True, None, None
    loss = _mlp_step(xs, ys, w1, w2, 0.1)
    w1.realize(w2, loss)
    losses.append(loss.item())
  return losses, [w1.numpy(), w2.numpy()]

def _mlp_data(batch: int) -> tuple[np.ndarray, ...]:
  rng = np.random.default_rng(3)
  return (rng.standard_normal((batch, 6)).astype(np.float32), rng.integers(0, 3, batch).astype(np.int32),
          (rng.standard_normal((6, 16)) * 0.4).astype(np.float32),
          (rng.standard_normal((16, 3)) * 0.4).astype(np.float32))

def test_sharded_mlp_train_step_equals_one_device(devs):
  data = _mlp_data(12)
  ref_losses, ref_params = _train(None, 2, data)
  losses, params = _train(devs, 2, data)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for got, want in zip(params, ref_params): np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert ref_losses[1] < ref_losses[0]

def test_sharded_mlp_train_step_on_four_null_devices():
  x = Tensor.empty(16, 6, device="NULL").shard(NULL4, 0)
  y = Tensor.empty(16, device="NULL", dtype="int32").shard(NULL4, 0)
  w1 = Tensor.empty(6, 16, device="NULL").to(NULL4).realize()
  w2 = Tensor.empty(16, 3, device="NULL").to(NULL4).realize()
  w1.requires_grad = w2.requires_grad = True
  loss = ((x @ w1).relu() @ w2).sparse_categorical_crossentropy(y)
  loss.backward()
  assert w1.grad is not None and w2.grad is not None
  items = loss.schedule(w1.grad, w2.grad)
  assert {it.device for it in items if it.kind == "kernel"} == set(NULL4)
  assert {it.bufs[0].device for it in items if it.kind == "copy"} == set(NULL4)  # allreduces of the loss and grads
  for w in (w1, w2): w.assign(w.detach() - 0.1 * w.grad)
  w1.realize(w2)
  assert isinstance(w1, MultiTensor) and [s.device for s in w1.shards] == list(NULL4) and w1.grad.axis is None

def test_gradient_of_sharded_input(devs):
  x, w = _rand(6, 4), _rand(4, 3, seed=1)
  xs = Tensor(x, device=devs[0]).shard(devs, 0).requires_grad_()
  ws = Tensor(w, device=devs[0]).to(devs).requires_grad_()
  ((xs @ ws) ** 2).sum().backward()
  assert xs.grad is not None and ws.grad is not None and xs.grad.axis == 0 and ws.grad.axis is None
  np.testing.assert_allclose(xs.grad.numpy(), 2 * (x @ w) @ w.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ws.grad.numpy(), x.T @ (2 * (x @ w)), rtol=1e-5, atol=1e-5)

# ** no class swap, no registry surgery: a sharded tensor is a Tensor holding a Sharding **

def test_sharded_tensors_stay_plain_tensors_and_registries_follow(devs):
  from ember import tensor as tensor_module
  x = _rand(6, 2)
  t = Tensor(x, device=devs[0])
  made = t.shard(devs, 0)
  assert type(made) is Tensor and made.sharding is not None
  assert t.shard_(devs, 0) is t and type(t) is Tensor and t.sharding is not None
  live = list(tensor_module.all_tensors)
  assert not any(s is t or s is made for s in live)  # no single graph: not listed there ...
  assert any(s is t for s in tensor_module.sharded_tensors.values())  # ... but here, with its shards listed there
  assert all(any(s is u for u in live) for s in t.shards)
  # code walking all_tensors (an assign realizes the pending readers of its buffer) meets no graph-less tensor
  y = Tensor(x, device=devs[0]).contiguous().realize()
  pending = y * 3
  y.assign(Tensor(x + 1, device=devs[0]))
  np.testing.assert_array_equal(pending.numpy(), x * 3)
  np.testing.assert_array_equal((t + 1).numpy(), x + 1)
  with pytest.raises(ShardingError, match="sharded tensor's"): _ = y.shards
  with pytest.raises(TypeError, match="isinstance"): MultiTensor()

def test_in_place_sharded_leaf_gets_its_gradient(devs):
  x = _rand(4, 3)
  t = Tensor(x, device=devs[0]).requires_grad_()
  t.shard_(devs, 0)
  (t * t).sum().backward()
  assert t.grad is not None and t.grad.axis == 0
  np.testing.assert_allclose(t.grad.numpy(), 2 * x, rtol=1e-6)

def test_replace_and_to_in_place_keep_or_take_a_layout(devs):
  x, z = _rand(6, 2), _rand(6, 2, seed=1)
  w = Tensor(x, device=devs[0]).shard(devs, 0)
  w.replace(Tensor(z, device=devs[1]))  # a plain value (a loaded state dict) takes the target's layout
  assert w.axis == 0 and w.devices == devs
  np.testing.assert_array_equal(w.numpy(), z)
  p = Tensor(x, device=devs[0])
  assert p.to_(devs) is p and isinstance(p, MultiTensor) and p.axis is None
  np.testing.assert_array_equal(p.shards[1].numpy(), x)

def test_shard_like_copies_unbalanced_split_points(devs):
  x = _rand(5, 2)
  y = Tensor(x, device=devs[0]).shard(devs, 0).reshape(10)  # rows split 3+2 -> items 6+4, where shard() splits 5+5
  z = Tensor(np.arange(10, dtype=np.float32), device=devs[0]).shard_like(y)
  assert z.axis == 0 and z.bounds == y.bounds == [(0, 6), (6, 10)]
  np.testing.assert_array_equal((z + y).numpy(), np.arange(10, dtype=np.float32) + x.reshape(10))

def test_multi_uses_only_public_tensor_names_and_tensor_imports_multi_lazily():
  import ast
  import ember.multi
  import ember.tensor
  multi_src = ast.parse(open(ember.multi.__file__).read())
  names = [a.name for n in ast.walk(multi_src) if isinstance(n, ast.ImportFrom) and n.module == "ember.tensor"
           for a in n.names]
  assert names and not [n for n in names if n.startswith("_")]
  tensor_src = ast.parse(open(ember.tensor.__file__).read())
  top = [n for n in tensor_src.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  assert not [n for n in top if "ember.multi" in ast.unparse(n)]
