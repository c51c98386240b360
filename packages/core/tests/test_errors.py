"""Bad calls raise ember's typed errors, and each is an instance of the builtin class torch raises for the same call
(computed by calling torch here): shapes, sizes, dims and dtypes checked before any graph is built."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor, Variable, dtypes
from ember.errors import ArgumentError, AxisError, EmptyReductionError, IndexingError, IndexRangeError, ShapeError

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch_oracle import check_raises_like_torch  # noqa: E402

def E(*shape: int) -> Tensor: return Tensor.ones(*shape)
def T(*shape: int) -> Any: return torch.ones(*shape)
def I(v: Any) -> Tensor: return Tensor(np.array(v, np.int32))  # noqa: E743
def TI(v: Any) -> Any: return torch.tensor(v)

BAD_CALLS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
  "cat_mismatch": (lambda: E(2,3).cat(E(2,4), dim=0), lambda: torch.cat([T(2,3), T(2,4)], 0)),
  "cat_static_mismatch": (lambda: Tensor.cat(E(2,3), E(2,4), dim=0), lambda: torch.cat([T(2,3), T(2,4)], 0)),
  "cat_rank": (lambda: Tensor.cat(E(2,3), E(3), dim=0), lambda: torch.cat([T(2,3), T(3)], 0)),
  "cat_baddim": (lambda: Tensor.cat(E(2,3), E(2,3), dim=2), lambda: torch.cat([T(2,3), T(2,3)], 2)),
  "stack_mismatch": (lambda: E(2,3).stack(E(2,4)), lambda: torch.stack([T(2,3), T(2,4)])),
  "stack_baddim": (lambda: E(2,3).stack(E(2,3), dim=4), lambda: torch.stack([T(2,3), T(2,3)], 4)),
  "empty_neg": (lambda: Tensor.empty(-5), lambda: torch.empty(-5)),
  "zeros_neg": (lambda: Tensor.zeros(2, -1), lambda: torch.zeros(2, -1)),
  "ones_neg": (lambda: Tensor.ones(-2), lambda: torch.ones(-2)),
  "full_neg": (lambda: Tensor.full((-2,), 1.0), lambda: torch.full((-2,), 1.0)),
  "rand_neg": (lambda: Tensor.rand(-3), lambda: torch.rand(-3)),
  "randn_neg": (lambda: Tensor.randn(-3), lambda: torch.randn(-3)),
  "reshape_bad": (lambda: E(2,3).reshape(4,2), lambda: T(2,3).reshape(4,2)),
  "reshape_two_neg": (lambda: E(2,3).reshape(-1,-1), lambda: T(2,3).reshape(-1,-1)),
  "reshape_neg2": (lambda: E(2,3).reshape(-2,3), lambda: T(2,3).reshape(-2,3)),
  "reshape_neg_nodiv": (lambda: E(2,3).reshape(-1,4), lambda: T(2,3).reshape(-1,4)),
  "expand_bad": (lambda: E(2,3).expand(2,4), lambda: T(2,3).expand(2,4)),
  "expand_fewer": (lambda: E(2,3).expand(3), lambda: T(2,3).expand(3)),
  "expand_neg_new": (lambda: E(3).expand(-1,3), lambda: T(3).expand(-1,3)),
  "expand_neg2": (lambda: E(1,3).expand(-2,3), lambda: T(1,3).expand(-2,3)),
  "permute_short": (lambda: E(2,3).permute(0), lambda: T(2,3).permute(0)),
  "permute_dup": (lambda: E(2,3).permute(0,0), lambda: T(2,3).permute(0,0)),
  "flip_dup": (lambda: E(2,3).flip(0,0), lambda: T(2,3).flip(0,0)),
  "flip_oob": (lambda: E(2,3).flip(2), lambda: T(2,3).flip(2)),
  "transpose_oob": (lambda: E(2,3).transpose(0,2), lambda: T(2,3).transpose(0,2)),
  "sum_oob": (lambda: E(2,3).sum(2), lambda: T(2,3).sum(2)),
  "sum_dup": (lambda: E(2,3).sum((0,0)), lambda: T(2,3).sum((0,0))),
  "squeeze_oob": (lambda: E(2,3).squeeze(3), lambda: T(2,3).squeeze(3)),
  "unsqueeze_oob": (lambda: E(2,3).unsqueeze(4), lambda: T(2,3).unsqueeze(4)),
  "split_bad": (lambda: E(5).split([2,2]), lambda: T(5).split([2,2])),
  "split_zero": (lambda: E(5).split(0), lambda: T(5).split(0)),
  "split_neg": (lambda: E(5).split([6,-1]), lambda: T(5).split([6,-1])),
  "chunk_zero": (lambda: E(5).chunk(0), lambda: T(5).chunk(0)),
  "chunk_oob": (lambda: E(5).chunk(2, 1), lambda: T(5).chunk(2, 1)),
  "gather_oob_dim": (lambda: E(2,3).gather(2, I([[0]])), lambda: T(2,3).gather(2, TI([[0]]))),
  "gather_rank": (lambda: E(2,3).gather(0, I([0])), lambda: T(2,3).gather(0, TI([0]))),
  "gather_float": (lambda: E(2,3).gather(0, E(1,3)), lambda: T(2,3).gather(0, T(1,3))),
  "gather_big_index_shape": (lambda: E(2,3).gather(0, I([[0,0,0,0]])), lambda: T(2,3).gather(0, TI([[0,0,0,0]]))),
  "scatter_rank": (lambda: E(2,3).scatter(0, I([0]), 1.0), lambda: T(2,3).scatter(0, TI([0]), 1.0)),
  "scatter_src_small": (lambda: E(2,3).scatter(0, I([[0,1,0]]), E(1,2)),
    lambda: T(2,3).scatter(0, TI([[0,1,0]]), T(1,2))),
  "index_select_oob": (lambda: E(2,3).index_select(2, I([0])), lambda: T(2,3).index_select(2, TI([0]))),
  "permute_oob": (lambda: E(2,3).permute(0,2), lambda: T(2,3).permute(0,2)),
  "index_select_2d": (lambda: E(2,3).index_select(0, I([[0]])), lambda: T(2,3).index_select(0, TI([[0]]))),
  "unfold_big": (lambda: E(5).unfold(0, 6, 1), lambda: T(5).unfold(0, 6, 1)),
  "unfold_step0": (lambda: E(5).unfold(0, 2, 0), lambda: T(5).unfold(0, 2, 0)),
  "unfold_oob": (lambda: E(5).unfold(1, 2, 1), lambda: T(5).unfold(1, 2, 1)),
  "repeat_few": (lambda: E(2,3).repeat(2), lambda: T(2,3).repeat(2)),
  "repeat_neg": (lambda: E(2,3).repeat(2,-1), lambda: T(2,3).repeat(2,-1)),
  "pad_odd": (lambda: E(2,3).pad((1,)), lambda: F.pad(T(2,3), (1,))),
  "pad_long": (lambda: E(3).pad((1,1,1,1)), lambda: F.pad(T(3), (1,1,1,1))),
  "pad_reflect_big": (lambda: E(1,3).pad((3,3), mode="reflect"), lambda: F.pad(T(1,3), (3,3), mode="reflect")),
  "conv_channels": (lambda: E(1,3,5,5).conv2d(E(4,2,3,3)), lambda: F.conv2d(T(1,3,5,5), T(4,2,3,3))),
  "conv_rank": (lambda: E(3,5,5,5,5).conv2d(E(4,3,3,3)), lambda: F.conv2d(T(3,5,5,5,5), T(4,3,3,3))),
  "conv_kernel_big": (lambda: E(1,3,2,2).conv2d(E(4,3,3,3)), lambda: F.conv2d(T(1,3,2,2), T(4,3,3,3))),
  "conv_groups": (lambda: E(1,4,5,5).conv2d(E(3,2,3,3), groups=2), lambda: F.conv2d(T(1,4,5,5), T(3,2,3,3), groups=2)),
  "conv_stride0": (lambda: E(1,3,5,5).conv2d(E(4,3,3,3), stride=0), lambda: F.conv2d(T(1,3,5,5), T(4,3,3,3), stride=0)),
  "conv_negpad": (lambda: E(1,3,5,5).conv2d(E(4,3,3,3), padding=-1),
    lambda: F.conv2d(T(1,3,5,5), T(4,3,3,3), padding=-1)),
  "conv_bias": (lambda: E(1,3,5,5).conv2d(E(4,3,3,3), E(3)), lambda: F.conv2d(T(1,3,5,5), T(4,3,3,3), T(3))),
  "maxpool_big": (lambda: E(1,1,2,2).max_pool2d(3), lambda: F.max_pool2d(T(1,1,2,2), 3)),
  "maxpool_stride0": (lambda: E(1,1,4,4).max_pool2d(2, stride=0), lambda: F.max_pool2d(T(1,1,4,4), 2, stride=0)),
  "avgpool_pad": (lambda: E(1,1,4,4).avg_pool2d(2, padding=2), lambda: F.avg_pool2d(T(1,1,4,4), 2, padding=2)),
  "maxpool_k0": (lambda: E(1,1,4,4).max_pool2d(0), lambda: F.max_pool2d(T(1,1,4,4), 0)),
  "matmul_mismatch": (lambda: E(2,3) @ E(4,2), lambda: T(2,3) @ T(4,2)),
  "matmul_0d": (lambda: E(2,3) @ Tensor(1.0), lambda: T(2,3) @ torch.tensor(1.0)),
  "matmul_batch": (lambda: E(2,2,3) @ E(3,3,2), lambda: T(2,2,3) @ T(3,3,2)),
  "einsum_ops": (lambda: Tensor.einsum("ij,jk->ik", E(2,3)), lambda: torch.einsum("ij,jk->ik", T(2,3))),
  "einsum_size": (lambda: Tensor.einsum("ij,jk->ik", E(2,3), E(4,2)),
    lambda: torch.einsum("ij,jk->ik", T(2,3), T(4,2))),
  "einsum_letters": (lambda: Tensor.einsum("ijk->i", E(2,3)), lambda: torch.einsum("ijk->i", T(2,3))),
  "einsum_outletter": (lambda: Tensor.einsum("ij->k", E(2,3)), lambda: torch.einsum("ij->k", T(2,3))),
  "add_broadcast": (lambda: E(2,3) + E(2,4), lambda: T(2,3) + T(2,4)),
  "where_broadcast": (lambda: (E(2,3) > 0).where(E(2,4), 0), lambda: torch.where(T(2,3) > 0, T(2,4), 0)),
  "index_oob": (lambda: E(3)[5], lambda: T(3)[5]),
  "index_too_many": (lambda: E(3)[0, 0], lambda: T(3)[0, 0]),
  "index_tensor_oob": (lambda: E(3)[I([5])], lambda: T(3)[TI([5])]),
  "index_float": (lambda: E(3)[E(1)], lambda: T(3)[T(1)]),
  "roll_mismatch": (lambda: E(3).roll((1,2), (0,)), lambda: T(3).roll((1,2), (0,))),
  "roll_oob": (lambda: E(3).roll(1, 1), lambda: T(3).roll(1, 1)),
  "topk_big": (lambda: E(3).topk(4), lambda: T(3).topk(4)),
  "diagonal_same": (lambda: E(3,3).diagonal(0, 0, 0), lambda: T(3,3).diagonal(0, 0, 0)),
  "softmax_oob": (lambda: E(3).softmax(1), lambda: T(3).softmax(1)),
  "cumsum_oob": (lambda: E(3).cumsum(1), lambda: T(3).cumsum(1)),
  "argmax_oob": (lambda: E(3).argmax(1), lambda: T(3).argmax(1)),
  "one_hot_float": (lambda: E(3).one_hot(3), lambda: F.one_hot(T(3), 3)),
  "masked_fill_float": (lambda: E(3).masked_fill(E(3), 0), lambda: T(3).masked_fill(T(3), 0)),
  "view_bad": (lambda: E(2,3).view(5), lambda: T(2,3).view(5)),
  "flatten_oob": (lambda: E(2,3).flatten(3), lambda: T(2,3).flatten(3)),
  "unflatten_bad": (lambda: E(6).unflatten(0, (4, 2)), lambda: T(6).unflatten(0, (4, 2))),
  "repeat_interleave_neg": (lambda: E(3).repeat_interleave(-1), lambda: T(3).repeat_interleave(-1)),
  "eye_neg": (lambda: Tensor.eye(-1), lambda: torch.eye(-1)),
  "linspace_neg": (lambda: Tensor.linspace(0, 1, -1), lambda: torch.linspace(0, 1, -1)),
  "dot_1d_mismatch": (lambda: E(3).dot(E(4)), lambda: T(3).dot(T(4))),
  "std_oob": (lambda: E(3).std(1), lambda: T(3).std(1)),
  "sdpa_mismatch": (lambda: E(1,2,4).scaled_dot_product_attention(E(1,2,3), E(1,2,3)),
    lambda: F.scaled_dot_product_attention(T(1,2,4), T(1,2,3), T(1,2,3))),
  "index_str": (lambda: E(3)["a"], lambda: T(3)["a"]),
  "index_step0": (lambda: E(3)[::0], lambda: T(3)[::0]),
  "randint_empty": (lambda: Tensor.randint(3, low=5, high=2), lambda: torch.randint(5, 2, (3,))),
  "dropout_p": (lambda: E(3).dropout(1.5), lambda: F.dropout(T(3), 1.5)),
  "interpolate_zero": (lambda: E(1,1,3,4).interpolate((0, 2)), lambda: F.interpolate(T(1,1,3,4), (0, 2))),
  "interpolate_scale_neg": (lambda: E(1,1,3,4).interpolate(scale_factor=-1.0),
    lambda: F.interpolate(T(1,1,3,4), scale_factor=-1.0)),
  "bce_reduction": (lambda: E(3).sigmoid().binary_crossentropy(E(3), reduction="avg"),
    lambda: F.binary_cross_entropy(T(3).sigmoid(), T(3), reduction="avg")),
  "gelu_approximate": (lambda: E(3).gelu(approximate="fast"), lambda: F.gelu(T(3), approximate="fast")),
  # index values held in tensors, out of range: torch checks them (RuntimeError or IndexError), ember's one-hot gathers
  # would read zeros and its scatters write nowhere
  "gather_value_oob": (lambda: E(4,3).gather(0, I([[9, 0, 0]])), lambda: T(4,3).gather(0, TI([[9, 0, 0]]))),
  "gather_value_negative": (lambda: E(4,3).gather(1, I([[-1, 0]])), lambda: T(4,3).gather(1, TI([[-1, 0]]))),
  "scatter_value_oob": (lambda: E(4,3).scatter(0, I([[5, 0, 0]]), E(1,3)),
    lambda: T(4,3).scatter(0, TI([[5, 0, 0]]), T(1,3))),
  "scatter_reduce_value_oob": (lambda: E(4,3).scatter_reduce(1, I([[0, 3]]), E(1,2), "amax"),
    lambda: T(4,3).scatter_reduce(1, TI([[0, 3]]), T(1,2), "amax")),
  "one_hot_value_oob": (lambda: I([1, 7]).one_hot(4), lambda: F.one_hot(TI([1, 7]), 4)),
  "one_hot_value_negative": (lambda: I([-1, 0]).one_hot(4), lambda: F.one_hot(TI([-1, 0]), 4)),
  "index_select_value_oob": (lambda: E(4,3).index_select(0, I([5])), lambda: T(4,3).index_select(0, TI([5]))),
  "nll_target_oob": (lambda: E(2,4).log_softmax(1).nll_loss(I([1, 7])),
    lambda: F.nll_loss(T(2,4).log_softmax(1), TI([1, 7]))),
  "cross_entropy_target_negative": (lambda: E(2,4).cross_entropy(I([1, -5])),
    lambda: F.cross_entropy(T(2,4), TI([1, -5]))),
  # weights torch's multinomial refuses: the draws would be silently wrong
  "multinomial_negative": (lambda: Tensor([0.5, -0.1, 0.6]).multinomial(1),
    lambda: torch.multinomial(torch.tensor([0.5, -0.1, 0.6]), 1)),
  "multinomial_nan": (lambda: Tensor([float("nan"), 1.0]).multinomial(1, replacement=True),
    lambda: torch.multinomial(torch.tensor([float("nan"), 1.0]), 1, replacement=True)),
  "multinomial_zero_row": (lambda: Tensor([[1.0, 2.0], [0.0, 0.0]]).multinomial(1),
    lambda: torch.multinomial(torch.tensor([[1.0, 2.0], [0.0, 0.0]]), 1)),
}

@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_call_raises_torchs_builtin_class(name: str) -> None:
  check_raises_like_torch(name, *BAD_CALLS[name])

def test_error_classes_subclass_the_builtins_in_the_docs() -> None:
  assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError)
  assert issubclass(AxisError, IndexError) and issubclass(AxisError, ValueError)
  assert issubclass(EmptyReductionError, IndexError) and issubclass(EmptyReductionError, RuntimeError)
  assert all(issubclass(AxisError, base) for base in np.exceptions.AxisError.__bases__)
  assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
  assert all(issubclass(IndexingError, b) for b in (IndexError, TypeError, ValueError))
  assert all(issubclass(IndexRangeError, b) for b in (AxisError, IndexError, RuntimeError))

def test_index_values_in_range_and_ignored_targets_pass_the_check() -> None:
  # the check names the offending value; values at the edges, negative tensor indices and ignore_index pass
  with pytest.raises(IndexRangeError, match="index 7 is out of range"): I([0, 7, 3]).one_hot(4)
  np.testing.assert_array_equal(E(4, 3).gather(0, I([[3, 0, 2]])).numpy(), np.ones((1, 3), np.float32))
  np.testing.assert_array_equal(Tensor(np.arange(4.0))[I([-4, 3])].numpy(), [0.0, 3.0])
  loss = Tensor(np.zeros((2, 4), np.float32)).cross_entropy(I([3, -100]))  # -100: torch's default ignore_index
  np.testing.assert_allclose(loss.item(), np.log(4), rtol=1e-6)

def test_tinyjit_replays_do_not_read_the_indices() -> None:
  # the check reads the indices (a sync): a TinyJit capture skips it, and its replays select zeros for such an index
  from ember import TinyJit
  table = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
  step = TinyJit(lambda t, i: t.gather(0, i).realize())
  for k in (1, 2, 3): np.testing.assert_array_equal(step(table, I([[k, 0, 0]])).numpy(), [[3.0 * k, 1, 2]])
  np.testing.assert_array_equal(step(table, I([[9, 0, 0]])).numpy(), [[0.0, 1, 2]])

def test_unsupported_index_and_argument_values_are_typed() -> None:
  # where torch takes the call or raises another class, ember's stricter refusal is still typed and says why
  with pytest.raises(IndexingError, match="single ellipsis"): E(2, 3)[..., ...]
  from ember import TinyJit
  masked = TinyJit(lambda t: t[t > 0].realize())
  masked(E(3))  # the first call runs eagerly: the mask is read on the host
  with pytest.raises(IndexingError, match="depends on the mask's values"): masked(E(3))  # the capture cannot read it
  with pytest.raises(ArgumentError, match="interpolate mode must be"): E(1, 1, 3, 4).interpolate((2, 2), mode="cubic")
  with pytest.raises(ArgumentError, match="out of range"): Variable("n", 1, 4).bind(9)

def test_cat_called_on_an_instance_keeps_self() -> None:
  a, b = Tensor([[1.0, 2.0]]), Tensor([[3.0, 4.0], [5.0, 6.0]])
  np.testing.assert_array_equal(a.cat(b, dim=0).numpy(), torch.cat([torch.tensor(a.numpy()), torch.tensor(b.numpy())]))
  assert Tensor.cat(a, b).shape == (3, 2) and a.cat(b).shape == (3, 2)

def test_index_select_matches_torch() -> None:
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  for dim, idx in ((0, [2, 0, 2]), (1, [3, 1]), (-1, [0])):
    ours = Tensor(x).index_select(dim, I(idx)).numpy()
    np.testing.assert_array_equal(ours, torch.tensor(x).index_select(dim, TI(idx)).numpy())

def test_python_number_conversions_and_iteration_as_in_torch() -> None:
  # int()/float()/operator.index() of a one-element tensor (they raised TypeError); iterating a 0-d tensor raises
  # TypeError as torch's does (Python's fallback through __getitem__ gave an empty list)
  import operator
  assert int(Tensor([-2.7])) == int(torch.tensor([-2.7])) and float(Tensor([[2.5]])) == 2.5
  assert operator.index(Tensor([3])) == 3 and list(range(Tensor(3))) == [0, 1, 2]
  with pytest.raises(TypeError): operator.index(Tensor([3.0]))
  with pytest.raises(RuntimeError): int(Tensor([1, 2]))  # torch: RuntimeError (more than one element)
  with pytest.raises(TypeError, match="0-d"): list(Tensor(1.0))
  rows = np.arange(6, dtype=np.float32).reshape(3, 2)
  assert [r.tolist() for r in Tensor(rows)] == [r.tolist() for r in torch.tensor(rows)]

def test_int_division_by_a_python_zero_raises() -> None:
  from ember.errors import IntegerDivisionByZeroError
  for op in (lambda t: t // 0, lambda t: t % 0, lambda t: t.div(0, rounding_mode="trunc"), lambda t: t.fmod(0)):
    with pytest.raises(ZeroDivisionError): op(Tensor([3, -4]))
    with pytest.raises(RuntimeError): op(Tensor([3, -4]))
    with pytest.raises(IntegerDivisionByZeroError): op(Tensor([3, 4], dtype=dtypes.uint8))
    with pytest.raises(RuntimeError): op(torch.tensor([3, -4]))  # torch raises RuntimeError("ZeroDivisionError")
  assert (Tensor([3.0]) // 0).item() == float("inf")  # floats divide by zero as IEEE says
  assert (7 // Tensor([0, 2])).tolist() == [0, 3]  # a divisor tensor's zeros are not read (no sync): they give 0

def test_an_allocation_the_host_cannot_make_is_a_typed_out_of_memory_error() -> None:
  # 2^50 bytes is past any x86-64 / arm64 user address space, so it fails whatever the overcommit policy; the tensor
  # the user built stays usable, and the next (small) realize works
  from ember.errors import OutOfMemoryError
  big = Tensor.zeros(2 ** 48, device="PYTHON").contiguous()
  with pytest.raises(OutOfMemoryError, match=r"out of memory allocating 1\.0 PiB") as info:
    big.realize()
  assert isinstance(info.value, MemoryError) and "smaller shapes" in str(info.value)
  np.testing.assert_array_equal((Tensor.ones(3, device="PYTHON") + 1).numpy(), [2, 2, 2])
  # past the address space, where ctypes/mmap raise OverflowError instead of a MemoryError: the same typed error
  huge = Tensor.zeros(2 ** 40, 2 ** 40, device="PYTHON").contiguous()
  with pytest.raises(OutOfMemoryError, match=r"out of memory allocating .* PiB \(4835703278458516698824704 bytes\)"):
    huge.realize()

def test_index_checks_read_indices_already_in_memory_on_the_host() -> None:
  # a realized index tensor (a batch's targets) is checked with numpy: no kernel, nothing to compile before the op
  # returns; a computed one still through a kernel, with the same message
  from ember import GlobalCounters
  x = Tensor.ones(4, 3).contiguous().realize()
  good, bad = Tensor([0, 1, 2, 1]).realize(), Tensor([0, 1, 5, 1]).realize()
  GlobalCounters.reset()
  x.cross_entropy(good)
  assert GlobalCounters.kernel_count == 0
  for index in (bad, (bad + 0)):  # in memory, computed
    with pytest.raises(IndexRangeError, match=r"index 5 is out of range \[0, 3\)"): x.cross_entropy(index)
    with pytest.raises(IndexRangeError, match=r"index 5 is out of range \[-4, 4\)"): x[index]
  np.testing.assert_allclose(x.cross_entropy(Tensor([0, -100, 2, 1]).realize(), ignore_index=-100).numpy(),
                             np.log(3), rtol=1e-6)

@pytest.mark.parametrize("padding", [(-5, 0), (-2, -2), (2, -4)])
@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_padding_that_crops_more_than_there_is_names_the_pad(padding, mode) -> None:
  # torch raises too (narrow(): length must be non-negative); ember's message named an internal shrink instead
  from ember.errors import ShapeError
  with pytest.raises(ShapeError, match=r"pad \(.*\): dim 1 has 3 elements, and its padding .* crops [45]"):
    Tensor.ones(2, 3).pad(padding, mode=mode)
  assert Tensor.ones(2, 3).pad((-1, -2)).shape == (2, 0) and Tensor.ones(2, 3).pad((-3, 1)).shape == (2, 1)
