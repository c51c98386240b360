"""Neural-network ops: matmul and einsum, convolution and pooling, attention, dropout and losses.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `PyBool`, `PyFloat`, `PyInt` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import functools
import math
from typing import TYPE_CHECKING, Sequence
from ember.dtype import dtypes, least_upper_dtype, narrow_float, strong_dtype, sum_acc_dtype
from ember.errors import ArgumentError, DTypeError, ShapeError
from ember.helpers import argsort, prod
from ember.uop.ops import int_shape, int_size, sint
from ember.tensor_index import check_index_range, data_checks_run

if TYPE_CHECKING:
  from ember.tensor import (PyBool, PyFloat, PyInt, Tensor)

LATE_NAMES = ('PyBool', 'PyFloat', 'PyInt', 'Tensor')

class NNMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** linear algebra **
  def dot(self: Tensor, w: Tensor) -> Tensor:
    """Matrix product with numpy/torch broadcasting semantics; 1-d operands are promoted and squeezed."""
    if self.ndim == 0 or w.ndim == 0:
      raise ShapeError(f"dot needs at least 1-d operands, got shapes {self.shape} and {w.shape}")
    x, y = self, w
    if x.shape[-1] != y.shape[-min(y.ndim, 2)]:
      inner = y.shape[-min(y.ndim, 2)]
      raise ShapeError(f"shape mismatch in matmul: {self.shape} @ {w.shape}; inner dims {x.shape[-1]} != {inner}")
    dt = least_upper_dtype(x.dtype, y.dtype)
    x = x.reshape(*x.shape[:-1], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), x.shape[-1])
    y_tail = min(y.ndim, 2)  # the contracted dim of y counts from the end: -1 for a vector, -2 for a matrix
    y = y.reshape(*y.shape[:-2], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), *y.shape[-y_tail:]).transpose(-1, -y_tail)
    return (x.cast(dt) * y.cast(dt)).sum(-1, dtype=sum_acc_dtype(dt) if not dtypes.is_float(dt) else None).cast(dt)
  def matmul(self: Tensor, x: Tensor, reverse: PyBool = False) -> Tensor: return x.dot(self) if reverse else self.dot(x)
  @staticmethod
  def einsum(formula: str, *operands: Tensor | Sequence[Tensor]) -> Tensor:
    """Einstein summation: "ij,jk->ik", implicit outputs ("ij,jk"), "..." broadcast dims and repeated letters within
    one operand (a diagonal, e.g. "ii->" is the trace).

    >>> Tensor.einsum("ij,j->i", Tensor([[1, 2], [3, 4]]), Tensor([1, 1])).tolist()
    [3, 7]
    """
    given = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    ops = [t for t in given if isinstance(t, Tensor)]
    if len(ops) != len(given):
      raise DTypeError(f"einsum operands must be Tensors, got {', '.join(type(t).__name__ for t in given)}")
    spec = formula.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops): raise ShapeError(f"einsum {formula!r} names {len(ins)} operands but {len(ops)} were given")
    for sub in (*ins, rhs):
      if sub.count("...") > 1 or not all(c.isascii() and c.isalpha() for c in sub.replace("...", "")):
        raise ShapeError(f"einsum {formula!r}: subscripts are letters a-z, A-Z and at most one '...' per operand")
    # "..." expands to one fresh symbol per dim the operand has beyond its named ones (not a letter: those are taken)
    ell_ndim = max((t.ndim - len(s.replace("...", "")) for s, t in zip(ins, ops) if "..." in s), default=0)
    ell = "".join(chr(0x100 + i) for i in range(ell_ndim))
    letters: list[str] = []
    for s, t in zip(ins, ops):
      extra = t.ndim - len(s.replace("...", ""))
      full = s.replace("...", ell[ell_ndim - extra:]) if "..." in s else s
      if len(full) != t.ndim: raise ShapeError(f"einsum operand {s!r} has {len(full)} letters but shape {t.shape}")
      letters.append(full)
    if arrow:
      out = rhs.replace("...", ell)
      if (missing := set(out) - set("".join(letters))) or len(set(out)) != len(out):
        raise ShapeError(f"einsum {formula!r}: output letters must appear in an input, each once ({sorted(missing)})")
    else:
      counts = {c: "".join(letters).count(c) for c in "".join(letters)}
      out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    alphabet = sorted(set("".join(letters)), key=lambda c: (c not in out, out.index(c) if c in out else c))
    sizes: dict[str, sint] = {}
    aligned = []
    for s, t in zip(letters, ops):
      # repeated letters in one operand: keep the diagonal
      while len(set(s)) != len(s):
        c = next(c for c in s if s.count(c) > 1)
        i, j = s.index(c), s.index(c, s.index(c) + 1)
        if t.shape[i] != t.shape[j]:
          raise ShapeError(f"einsum {formula!r}: subscript {c!r} repeats in one operand over sizes {t.shape[i]} != "
                           f"{t.shape[j]} (shape {t.shape})")
        t = t.diagonal(0, i, j)
        s = s[:i] + s[i + 1:j] + s[j + 1:] + c
      for c, n in zip(s, t.shape):
        if sizes.setdefault(c, n) != n and n != 1 and sizes[c] != 1:
          raise ShapeError(f"einsum {formula!r}: letter {c!r} is {sizes[c]} in one operand and {n} in another")
        if sizes[c] == 1: sizes[c] = n
      order = sorted(s, key=alphabet.index)
      t = t.permute([s.index(c) for c in order])
      aligned.append(t.reshape([t.shape[order.index(c)] if c in s else 1 for c in alphabet]))
    dt = least_upper_dtype(*(t.dtype for t in aligned))
    acc = aligned[0].cast(dt)
    for t in aligned[1:]: acc = acc * t.cast(dt)
    reduce_axes = [i for i, c in enumerate(alphabet) if c not in out]
    acc_dt = sum_acc_dtype(dt) if not dtypes.is_float(dt) else None
    ret = acc.sum(reduce_axes, dtype=acc_dt).cast(dt) if reduce_axes else acc
    return ret._broadcast_to(tuple(sizes[c] for c in out)) if ret.shape != tuple(sizes[c] for c in out) else ret
  # ** convolution and pooling **
  def _pool(self: Tensor, kernel: tuple[PyInt, ...], stride: tuple[PyInt, ...], dilation: tuple[PyInt, ...]) -> Tensor:
    """Sliding windows over the last len(kernel) dims: (..., *spatial) -> (..., *out, *kernel), built from movement ops
    only. Per dim: tile the input e times, view it as rows of (i + d), and row a column o*s is x[o*s + a*d]."""
    nd = len(kernel)
    x = self
    lead = x.ndim - nd
    for j, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
      ax = lead + j * 2  # earlier dims are already (out, kernel) pairs
      i = int_size(x.shape[ax], "pooling")
      o = (i - d * (k - 1) - 1) // s + 1
      if o <= 0: raise ShapeError(f"pool window {k} (dilation {d}) is larger than the padded input size {i}")
      if o * s > i + d:  # a stride longer than the window: room for the row view below (the padding is never read)
        x = x.pad(tuple((0, o * s - i - d) if a == ax else (0, 0) for a in range(x.ndim)))
        i = o * s - d
      e = -(-(k * (i + d)) // i)
      pre, post = x.shape[:ax], x.shape[ax + 1:]
      x = x.reshape(*pre, 1, i, *post).expand(*pre, e, i, *post).reshape(*pre, e * i, *post)
      x = x._slice_dim(ax, 0, k * (i + d)).reshape(*pre, k, i + d, *post)
      x = x._slice_dim(ax + 1, 0, o * s).reshape(*pre, k, o, s, *post)
      x = x._slice_dim(ax + 2, 0, 1).reshape(*pre, k, o, *post)
      x = x.transpose(ax, ax + 1)  # (..., o, k, ...)
    order = list(range(lead)) + [lead + 2 * j for j in range(nd)] + [lead + 2 * j + 1 for j in range(nd)]
    return x.permute(order)
  @staticmethod
  def _tuple_arg(v: PyInt | Sequence[PyInt], n: PyInt, name: str, low: PyInt = 1) -> tuple[PyInt, ...]:
    """One int per spatial dim, each at least `low` (1 for kernel sizes, strides and dilations; 0 for paddings)."""
    ret = (v,) * n if isinstance(v, int) else tuple(int(a) for a in v)
    if len(ret) != n: raise ShapeError(f"{name} {ret} needs {n} entries, one per spatial dim")
    if any(a < low for a in ret): raise ShapeError(f"{name} {ret} must be >= {low} in every spatial dim")
    return ret
  @staticmethod
  def _pad_pairs(padding: PyInt | Sequence[PyInt], n: PyInt) -> list[tuple[PyInt, PyInt]]:
    """Per spatial dim (before, after): an int, one int per dim (symmetric) or 2*n ints (torch F.pad order, last dim
    first: left, right, top, bottom, ...)."""
    pads = [padding] if isinstance(padding, int) else [int(p) for p in padding]
    if any(p < 0 for p in pads): raise ShapeError(f"padding {tuple(pads)} must be >= 0; shrink the input to crop it")
    if len(pads) == 1: return [(pads[0], pads[0])] * n
    if len(pads) == n: return [(p, p) for p in pads]
    if len(pads) == 2 * n: return [(pads[2 * (n - 1 - j)], pads[2 * (n - 1 - j) + 1]) for j in range(n)]
    raise ShapeError(f"padding {tuple(pads)} needs 1, {n} or {2 * n} entries for {n} spatial dims")
  @staticmethod
  def _conv_padding(padding: PyInt | Sequence[PyInt] | str, nd: PyInt, kernel: tuple[PyInt, ...],
                    stride: PyInt | Sequence[PyInt], dilation: PyInt | Sequence[PyInt]) -> list[tuple[PyInt, PyInt]]:
    """conv2d's padding as (before, after) per spatial dim, with torch's "valid" and "same" strings."""
    if not isinstance(padding, str): return Tensor._pad_pairs(padding, nd)
    if padding == "valid": return [(0, 0)] * nd
    if padding != "same": raise ShapeError(f"conv2d padding string must be 'same' or 'valid', got {padding!r}")
    if any(v != 1 for v in Tensor._tuple_arg(stride, nd, "stride")):
      raise ShapeError(f"conv2d padding='same' needs stride 1, got stride {stride}; pad explicitly instead")
    totals = [d * (k - 1) for d, k in zip(Tensor._tuple_arg(dilation, nd, "dilation"), kernel)]
    return [(t // 2, t - t // 2) for t in totals]
  def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: PyInt = 1,
             stride: PyInt | Sequence[PyInt] = 1,
             dilation: PyInt | Sequence[PyInt] = 1, padding: PyInt | Sequence[PyInt] | str = 0) -> Tensor:
    """N-d convolution (1d/2d/3d from the weight's rank): input (N, Cin, *spatial), weight (Cout, Cin/groups,
    *kernel). `padding`: int, one per dim, 2 per dim in F.pad order (asymmetric), "valid" (none) or "same" (output
    as large as the input, stride 1; an odd total puts the extra row/col at the end, like torch).

    >>> Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(1, 1, 2, 2)).tolist()
    [[[[4.0, 4.0], [4.0, 4.0]]]]
    """
    nd = weight.ndim - 2
    if nd < 1 or self.ndim != nd + 2:
      raise ShapeError(f"conv2d: input {self.shape} and weight {weight.shape} need ranks n+2 and n+2 (n spatial dims)")
    bs, cin = self.shape[:2]
    cout, cin_g = weight.shape[:2]
    if cin != cin_g * groups or cout % groups != 0:
      raise ShapeError(f"conv2d: input channels {cin} != weight channels {cin_g} * groups {groups} "
                       f"(input {self.shape}, weight {weight.shape}), or out channels {cout} not divisible by groups")
    kernel = int_shape(weight.shape[2:], "conv2d")
    pads = Tensor._conv_padding(padding, nd, kernel, stride, dilation)
    x = self.pad(((0, 0), (0, 0), *pads))
    pool_args = (kernel, Tensor._tuple_arg(stride, nd, "stride"), Tensor._tuple_arg(dilation, nd, "dilation"))
    # groups=1 is an implicit GEMM: the padded image is copied channels-last once, then one reduction over
    # (*kernel, Cin) reads its windows in place (affine indices, no gates) and stores (N, *out, Cout), Cout innermost:
    # the kernel is matmul-like with Cout as its columns (register blocks, the weight packed), and no im2col matrix is
    # written (the bench's conv: 115 MB and 10 ms). One copy then makes it (N, Cout, *out).
    # The copy is channels-last in blocks of 32 (or 16) channels, (N, Cin/32, *padded, 32): each pixel's store reads 32
    # channel planes instead of all Cin (64 planes at once: 5.8 -> 3.2 ms for the bench's input on one thread); the
    # reduction then runs over (*kernel, Cin/32, 32), the main kernel's speed unchanged. A window with more taps than
    # the output has pixels (a weight gradient's: 28 x 28 taps, 3 x 3 outputs) keeps Cin whole: its copy is small
    # beside the reduction, which an extra loop level slowed (4.8 -> 5.1-5.4 ms, fashion-MNIST's conv, batch 128).
    implicit = groups == 1 and all(isinstance(s, int) for s in x.shape)
    if implicit:
      outs = prod((i - d * (k - 1) - 1) // st + 1 for i, k, st, d in zip(int_shape(x.shape[2:], "conv2d"), *pool_args))
      blk = next((b for b in (32, 16) if cin % b == 0), cin) if prod(kernel) <= outs else cin
      ch = (cin // blk, blk) if blk < cin else (cin,)  # the channels as (blocks, block), or one block
      order = [0, *range(1, len(ch)), *range(1 + len(ch), 1 + len(ch) + nd), len(ch)]  # the block innermost
      xb = x.reshape(bs, *ch, *x.shape[2:]).permute(order).contiguous().permute(argsort(order))
      win = xb._pool(*pool_args)
      out_sp = win.shape[1 + len(ch):1 + len(ch) + nd]  # win: (N, *ch, *out, *kernel)
      win = win.permute(0, *range(1 + len(ch), 1 + len(ch) + 2 * nd), *range(1, 1 + len(ch)))
      win = win.reshape(bs, *out_sp, 1, *kernel, *ch)
      w = weight.reshape(cout, *ch, *kernel).permute(0, *range(1 + len(ch), 1 + len(ch) + nd), *range(1, 1 + len(ch)))
      w = w.reshape(1, *([1] * nd), cout, *kernel, *ch)
      axes = list(range(nd + 2, 2 * nd + 2 + len(ch)))
    else:  # (N, G, 1, Cin/G, *out, *k) * (1, G, Cout/G, Cin/G, *1, *k) summed over Cin/G and the kernel
      win = x._pool(*pool_args)  # (N, Cin, *out, *kernel)
      out_sp = win.shape[2:2 + nd]
      win = win.reshape(bs, groups, 1, cin_g, *out_sp, *kernel)
      w = weight.reshape(1, groups, cout // groups, cin_g, *([1] * nd), *kernel)
      axes = [3] + list(range(4 + nd, 4 + 2 * nd))
    dt = least_upper_dtype(win.dtype, w.dtype)
    acc_dt = sum_acc_dtype(dt) if not dtypes.is_float(dt) else None
    out = (win.cast(dt) * w.cast(dt)).sum(axes, dtype=acc_dt).cast(dt)
    out = out.contiguous().permute(0, nd + 1, *range(1, nd + 1)) if implicit else out.reshape(bs, cout, *out_sp)
    if implicit and all(b >= 0 and a >= 0 for b, a in pads):
      # its gradients are convolutions too (on the same implicit-GEMM path): autograd through the windows would write
      # the gradient of every window position (N, *out, *kernel, Cin) and then sum the overlaps in a second pass
      from ember.gradient import custom_gradient
      out = custom_gradient(out, (self, weight), functools.partial(_conv_grad, stride=pool_args[1],
                                                                   dilation=pool_args[2], pads=tuple(pads)))
    return out if bias is None else out + bias.reshape(1, cout, *([1] * nd))
  def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: PyInt = 1,
                       stride: PyInt | Sequence[PyInt] = 1, dilation: PyInt | Sequence[PyInt] = 1,
                       padding: PyInt | Sequence[PyInt] = 0, output_padding: PyInt | Sequence[PyInt] = 0) -> Tensor:
    """Transposed convolution (the gradient of conv2d): weight (Cin, Cout/groups, *kernel); `output_padding` adds
    rows/cols on the far side of each spatial dim.

    >>> Tensor.ones(1, 1, 2, 2).conv_transpose2d(Tensor.ones(1, 1, 2, 2)).shape
    (1, 1, 3, 3)
    """
    nd = weight.ndim - 2
    if self.ndim != nd + 2:
      raise ShapeError(f"conv_transpose2d: input {self.shape} and weight {weight.shape} ranks differ")
    cin, cout_g = weight.shape[:2]
    if self.shape[1] != cin:
      raise ShapeError(f"conv_transpose2d: input channels {self.shape[1]} != weight {weight.shape} dim 0")
    kernel = int_shape(weight.shape[2:], "conv_transpose2d")
    st, dl = Tensor._tuple_arg(stride, nd, "stride"), Tensor._tuple_arg(dilation, nd, "dilation")
    pd = Tensor._tuple_arg(padding, nd, "padding", low=0)
    op = Tensor._tuple_arg(output_padding, nd, "output_padding", low=0)
    x = self
    # spread the input: s-1 zeros between neighbours
    for j, s in enumerate(st):
      if s == 1: continue
      ax = 2 + j
      i = int_size(x.shape[ax], "conv_transpose2d")
      x = x.unsqueeze(ax + 1).pad(tuple((0, s - 1) if a == ax + 1 else (0, 0) for a in range(x.ndim + 1)))
      x = x.reshape(*x.shape[:ax], i * s, *x.shape[ax + 2:])._slice_dim(ax, 0, (i - 1) * s + 1)
    pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, d, p, o in zip(kernel, dl, pd, op)]
    x = x.pad(((0, 0), (0, 0), *pads))
    # (Cin, Cout/G, *k) -> (Cout, Cin/G, *k), flipped in space
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).transpose(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, *kernel)
    w = w.flip(list(range(2, 2 + nd)))
    return x.conv2d(w, bias, groups=groups, dilation=dl)
  def _pool_geometry(self: Tensor, kernel_size: PyInt | Sequence[PyInt], stride: PyInt | Sequence[PyInt] | None,
                     padding: PyInt | Sequence[PyInt], dilation: PyInt | Sequence[PyInt],
                     ceil_mode: PyBool) -> tuple[tuple[PyInt, ...], ...]:
    """(kernel, stride, dilation, pad_before, pad_after) for the last len(kernel) dims; pad_after includes the extra
    room ceil_mode needs (torch: the last window must start inside the input or its left padding)."""
    nd = 2 if isinstance(kernel_size, int) else len(kernel_size)
    k = Tensor._tuple_arg(kernel_size, nd, "kernel_size")
    no_stride = stride is None or (not isinstance(stride, int) and len(stride) == 0)
    s = k if no_stride or stride is None else Tensor._tuple_arg(stride, nd, "stride")
    d = Tensor._tuple_arg(dilation, nd, "dilation")
    p = Tensor._tuple_arg(padding, nd, "padding", low=0)
    after = []
    for kk, ss, dd, pp, i in zip(k, s, d, p, int_shape(self.shape[-nd:], "pooling")):
      if pp * 2 > kk: raise ShapeError(f"pool padding {pp} must be at most half the kernel size {kk}")
      span = i + 2 * pp - dd * (kk - 1) - 1
      o = (-(-span // ss) if ceil_mode else span // ss) + 1
      if ceil_mode and (o - 1) * ss >= i + pp: o -= 1
      after.append(pp + max(0, (o - 1) * ss + dd * (kk - 1) + 1 - (i + 2 * pp)))
    return k, s, d, p, tuple(after)
  def max_pool2d(self: Tensor, kernel_size: PyInt | Sequence[PyInt] = (2, 2),
                 stride: PyInt | Sequence[PyInt] | None = None,
                 dilation: PyInt | Sequence[PyInt] = 1, padding: PyInt | Sequence[PyInt] = 0, ceil_mode: PyBool = False,
                 return_indices: PyBool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of the last len(kernel_size) dims (stride defaults to the kernel). With `return_indices`, also
    the int32 flat index (over the unpadded spatial dims) of each max, the first on ties, like torch.

    >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d().tolist()
    [[[[4.0]]]]
    """
    k, s, d, p, after = self._pool_geometry(kernel_size, stride, padding, dilation, ceil_mode)
    nd = len(k)
    pads = ((0, 0),) * (self.ndim - nd) + tuple(zip(p, after))
    low = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(strong_dtype(self.dtype))
    win = self.pad(pads, value=low)._pool(k, s, d)
    flat_k = win.reshape(*win.shape[:win.ndim - nd], int(prod(k)))
    out = flat_k.max(-1)
    if not return_indices: return out
    spatial = self.shape[-nd:]
    ids = Tensor.arange(int(prod(spatial)), device=self.device, dtype=dtypes.int32).reshape(spatial)
    out_sp = win.shape[self.ndim - nd:win.ndim - nd]
    id_win = ids.pad(tuple(zip(p, after)), value=-1)._pool(k, s, d).reshape(*out_sp, int(prod(k)))
    first = flat_k.detach()._arg_first(flat_k.detach() == out.detach().unsqueeze(-1), -1, False)
    pick = first.unsqueeze(-1) == Tensor.arange(int(prod(k)), device=self.device, dtype=dtypes.int32)
    return out, pick.where(id_win, 0).sum(-1, dtype=dtypes.int32)
  def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: PyInt | Sequence[PyInt] = (2, 2),
                   stride: PyInt | Sequence[PyInt] | None = None, dilation: PyInt | Sequence[PyInt] = 1,
                   padding: PyInt | Sequence[PyInt] = 0, output_size: Sequence[PyInt] | None = None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True): each value goes to its flat index, zeros elsewhere.

    >>> v, i = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d(return_indices=True)
    >>> v.max_unpool2d(i).tolist()
    [[[[0.0, 0.0], [0.0, 4.0]]]]
    """
    if indices.shape != self.shape:
      raise ShapeError(f"max_unpool2d: indices {indices.shape} must match values {self.shape}")
    nd = 2 if isinstance(kernel_size, int) else len(kernel_size)
    k = Tensor._tuple_arg(kernel_size, nd, "kernel_size")
    s = k if stride is None else Tensor._tuple_arg(stride, nd, "stride")
    d, p = Tensor._tuple_arg(dilation, nd, "dilation"), Tensor._tuple_arg(padding, nd, "padding", low=0)
    geo = zip(int_shape(self.shape[-nd:], "max_unpool2d"), s, p, d, k)
    default = tuple((i - 1) * ss - 2 * pp + dd * (kk - 1) + 1 for i, ss, pp, dd, kk in geo)
    spatial = default if output_size is None else tuple(int(v) for v in output_size[-nd:])
    # torch's rule: an explicit size lies strictly within a stride of the default one (the size max_pool2d's input had)
    if output_size is not None and (len(output_size) not in (nd, nd + 2) or
                                    any(not o - ss < v < o + ss for v, o, ss in zip(spatial, default, s))):
      raise ShapeError(f"max_unpool2d output_size {tuple(output_size)} must give {nd} spatial sizes, each strictly "
                       f"within a stride {s} of the default {default}")
    lead = self.shape[:-nd]
    # an index outside the output would be dropped silently: check it, as torch does (where data checks run)
    if data_checks_run() and indices.numel() and ((indices < 0) | (indices >= prod(spatial))).any().item():
      raise ShapeError(f"max_unpool2d indices must lie in [0, {prod(spatial)}) for output size {spatial}; pass the "
                       "output_size max_pool2d's input had")
    flat = Tensor.zeros(*lead, int(prod(spatial)), dtype=strong_dtype(self.dtype), device=self.device)
    idx, values = indices.flatten(len(lead)), self.flatten(len(lead))
    placed = flat._scatter(len(lead), idx, values.detach())  # indices checked above
    if dtypes.is_float(values.dtype):
      # torch's gradient: every value gets the output gradient at its index, also where overlapping windows put several
      # (equal) values on one index and the scatter keeps one: the gradient of a sum-scatter, added as zero
      summed = flat._scatter_reduce(len(lead), idx, values, "sum", include_self=False)
      placed = placed + summed.isfinite().where(summed - summed.detach(), 0)
    return placed.reshape(*lead, *spatial)
  def avg_pool2d(self: Tensor, kernel_size: PyInt | Sequence[PyInt] = (2, 2),
                 stride: PyInt | Sequence[PyInt] | None = None,
                 padding: PyInt | Sequence[PyInt] = 0, ceil_mode: PyBool = False, count_include_pad: PyBool = True,
                 divisor_override: PyInt | None = None, dilation: PyInt | Sequence[PyInt] = 1) -> Tensor:
    """Mean over windows of the last len(kernel_size) dims. The divisor counts padding when `count_include_pad`, but
    never the extra room ceil_mode adds (torch's rule); `divisor_override` divides every window sum by that instead.

    >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).avg_pool2d().tolist()
    [[[[2.5]]]]
    """
    if divisor_override is not None and divisor_override == 0:
      raise ShapeError("avg_pool2d divisor_override must not be zero; pass None to divide by the window count")
    k, s, d, p, after = self._pool_geometry(kernel_size, stride, padding, dilation, ceil_mode)
    nd = len(k)
    x = self._float()
    win = x.pad(((0, 0),) * (self.ndim - nd) + tuple(zip(p, after)))._pool(k, s, d)
    total = win.sum(list(range(win.ndim - nd, win.ndim)))
    if divisor_override is not None: return total / divisor_override
    spatial = int_shape(self.shape[-nd:], "avg_pool2d")
    ones = Tensor.ones(*spatial, dtype=x.dtype, device=self.device)
    if count_include_pad:
      ones = ones.pad(tuple(zip(p, p)), value=1.0).pad(tuple((0, a - pp) for pp, a in zip(p, after)))
    else: ones = ones.pad(tuple(zip(p, after)))
    count = ones._pool(k, s, d).sum(list(range(nd, 2 * nd)))
    return total / count
  def interpolate(self: Tensor, size: PyInt | Sequence[PyInt] | None = None, mode: str = "linear",
                  align_corners: PyBool = False, scale_factor: PyFloat | Sequence[PyFloat] | None = None) -> Tensor:
    """Resize the trailing spatial dims (all but N, C) to `size` (or by `scale_factor`), like F.interpolate:
    mode linear/bilinear/trilinear (separable linear, `align_corners`), nearest or nearest-exact.

    >>> Tensor([[[1.0, 3.0]]]).interpolate(size=3, align_corners=True).tolist()
    [[[1.0, 2.0, 3.0]]]
    """
    nd = self.ndim - 2
    if nd < 1: raise ShapeError(f"interpolate needs (N, C, *spatial) input, got shape {self.shape}")
    if mode not in ("linear", "bilinear", "trilinear", "nearest", "nearest-exact"):
      raise ArgumentError(f"interpolate mode must be linear, bilinear, trilinear, nearest or nearest-exact, got "
                          f"{mode!r}")
    ins = list(int_shape(self.shape[2:], "interpolate"))
    if size is not None:
      outs = [int(size)] * nd if isinstance(size, int) else [int(v) for v in size]
      scales = [i / o if o > 0 else 0.0 for i, o in zip(ins, outs)]  # (a size <= 0 is refused below)
    elif scale_factor is not None:
      sf = [float(scale_factor)] * nd if isinstance(scale_factor, (int, float)) else [float(v) for v in scale_factor]
      if not all(f > 0 for f in sf): raise ArgumentError(f"interpolate scale_factor {sf} must be positive in every dim")
      outs = [int(math.floor(i * f)) for i, f in zip(ins, sf)]
      scales = [1 / f for f in sf]
    else: raise ArgumentError("interpolate needs size or scale_factor")
    if len(outs) != nd: raise ShapeError(f"interpolate size {outs} needs {nd} entries for input shape {self.shape}")
    if any(o <= 0 for o in outs):
      raise ShapeError(f"interpolate of {self.shape} to spatial size {outs}: every output size must be positive")
    x = self if mode.startswith("nearest") else self._float()
    for j, (i, o, sc) in enumerate(zip(ins, outs, scales)):
      ax = 2 + j
      if mode == "nearest": src = [min(int(math.floor(t * sc)), i - 1) for t in range(o)]
      elif mode == "nearest-exact": src = [min(int(math.floor((t + 0.5) * sc)), i - 1) for t in range(o)]
      if mode.startswith("nearest"):
        x = x[(slice(None),) * ax + (src,)]
        continue
      if align_corners: pos = [t * (i - 1) / (o - 1) if o > 1 else 0.0 for t in range(o)]
      else: pos = [max((t + 0.5) * sc - 0.5, 0.0) for t in range(o)]
      lo = [min(int(math.floor(v)), i - 1) for v in pos]
      hi = [min(v + 1, i - 1) for v in lo]
      frac = Tensor([v - f for v, f in zip(pos, lo)], dtype=x.dtype, device=self.device)
      frac = frac.reshape(o, *([1] * (nd - 1 - j)))
      x = x[(slice(None),) * ax + (lo,)] * (1 - frac) + x[(slice(None),) * ax + (hi,)] * frac
    if x.dtype is self.dtype: return x
    # int input (torch: uint8) keeps its dtype: the interpolated values rounded half up, within the dtype's range
    return (x + 0.5).floor().clip(dtypes.min(self.dtype), dtypes.max(self.dtype)).cast(self.dtype)
  def dropout(self: Tensor, p: PyFloat = 0.5, training: PyBool | None = None) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1/(1-p), only in training mode: `training`, or
    when it is None the global mode (`Tensor.is_training()`: `Tensor.training` or `Context(TRAINING=1)`).

    >>> Tensor.ones(3).dropout(0.5).tolist()  # not training: unchanged
    [1.0, 1.0, 1.0]
    """
    if not 0 <= p <= 1: raise ArgumentError(f"dropout probability must be in [0, 1], got {p}")
    if not (Tensor.is_training() if training is None else training) or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))
  def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: PyFloat = 0.0, is_causal: PyBool = False, scale: PyFloat | None = None,
                                   enable_gqa: PyBool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v with q = self (..., L, E). A bool `attn_mask` keeps where True, a float one
    is added; `is_causal` masks the future; `enable_gqa` repeats key/value heads to match the query's.

    >>> q = Tensor.ones(1, 2, 4)
    >>> q.scaled_dot_product_attention(q, q).shape
    (1, 2, 4)
    """
    if self.shape[-1] != key.shape[-1]:
      raise ShapeError(f"sdpa: query {self.shape} and key {key.shape} feature dims differ")
    if is_causal and attn_mask is not None:
      raise ShapeError("sdpa: pass attn_mask or is_causal=True, not both; fold the causal mask into attn_mask")
    if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
      rep = int_size(self.shape[-3], "sdpa's enable_gqa") // int_size(key.shape[-3], "sdpa's enable_gqa")
      key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    if narrow_float(self.dtype):  # half scores overflow (64 products of 30s): computed in float32, as torch's CPU path
      mask = attn_mask.float() if attn_mask is not None and dtypes.is_float(attn_mask.dtype) else attn_mask
      return self.float().scaled_dot_product_attention(key.float(), value.float(), mask, dropout_p, is_causal, scale,
                                                       enable_gqa).cast(self.dtype)
    sc = scale if scale is not None else 1 / math.sqrt(int_size(self.shape[-1], "sdpa's default scale"))
    scores = (self @ key.transpose(-2, -1)) * sc
    if is_causal:
      L, S = int_size(self.shape[-2], "sdpa's is_causal"), int_size(key.shape[-2], "sdpa's is_causal")
      scores = Tensor.ones(L, S, dtype=dtypes.bool, device=self.device).tril().where(scores, -math.inf)
    if attn_mask is not None:
      scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype is dtypes.bool else scores + attn_mask
    return scores.softmax(-1).dropout(dropout_p) @ value
  # ** losses **
  def _reduce_loss(self: Tensor, reduction: str) -> Tensor:
    if reduction == "none": return self
    if reduction == "sum": return self.sum()
    if reduction == "mean": return self.mean()
    raise ArgumentError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
  def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
    """-(y log p + (1 - y) log(1 - p)) for probabilities p = self, logs clamped at -100 like torch.

    >>> round(Tensor([0.5]).binary_crossentropy(Tensor([1.0])).item(), 5)
    0.69315
    """
    if Y.shape != self.shape: raise ShapeError(f"binary_crossentropy: input {self.shape} and target {Y.shape} differ")
    p = self._float()
    return (-(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100)))._reduce_loss(reduction)
  def binary_crossentropy_logits(self: Tensor, Y: Tensor, reduction: str = "mean",
                                 pos_weight: Tensor | None = None) -> Tensor:
    """Binary cross-entropy on logits (sigmoid folded in, numerically stable); `pos_weight` scales the positive term.

    >>> round(Tensor([0.0]).binary_crossentropy_logits(Tensor([1.0])).item(), 5)
    0.69315
    """
    if Y.shape != self.shape:
      raise ShapeError(f"binary_crossentropy_logits: input {self.shape} and target {Y.shape} differ")
    x = self._float()
    log_sig_neg = (-x).softplus()  # -log(sigmoid(x))
    if pos_weight is None: loss = (1 - Y) * x + log_sig_neg
    else: loss = (1 - Y) * x + (1 + (pos_weight - 1) * Y) * log_sig_neg
    return loss._reduce_loss(reduction)
  def nll_loss(self: Tensor, Y: Tensor, weight: Tensor | None = None, ignore_index: PyInt = -100,
               reduction: str = "mean",
               label_smoothing: PyFloat = 0.0) -> Tensor:
    """Negative log likelihood of log-probabilities (N, C, ...) (or (C,)) at class indices Y, class dim 1. `weight`
    weighs classes, `ignore_index` targets count nowhere, mean divides by the summed weight of the counted targets.

    >>> Tensor([[-1.0, -2.0]]).nll_loss(Tensor([1])).item()
    2.0
    """
    if not dtypes.is_int(Y.dtype): raise DTypeError(f"nll_loss target must hold int class indices, got {Y.dtype!r}")
    logp = self.unsqueeze(0) if self.ndim == 1 else self
    tgt = Y.unsqueeze(0) if self.ndim == 1 else Y
    if tgt.shape != logp.shape[:1] + logp.shape[2:]:
      raise ShapeError(f"nll_loss: input {self.shape} needs target shape {logp.shape[:1] + logp.shape[2:]}, got "
                       f"{Y.shape}")
    c = int_size(logp.shape[1], "nll_loss")
    check_index_range(tgt, c, f"nll_loss target over {c} classes (ignore_index {ignore_index})", low=0,
                      skip=ignore_index)
    classes = Tensor.arange(c, device=self.device, dtype=tgt.dtype).reshape(1, c, *([1] * (logp.ndim - 2)))
    onehot = tgt.unsqueeze(1) == classes  # (N, C, ...)
    keep = (tgt != ignore_index).cast(logp.dtype)  # (N, ...)
    w = weight.cast(logp.dtype).reshape(1, c, *([1] * (logp.ndim - 2))) if weight is not None else None
    picked = onehot.where(logp if w is None else logp * w, 0).sum(1)
    loss = -picked * keep
    w_t = onehot.where(w, 0).sum(1) * keep if w is not None else keep
    if label_smoothing:
      smooth = -(logp if w is None else logp * w).sum(1) * keep
      loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / c)
    if reduction == "mean": return loss.sum() / w_t.sum()
    if reduction == "none" and self.ndim == 1: return loss.reshape(())
    return loss._reduce_loss(reduction)
  def cross_entropy(self: Tensor, Y: Tensor, reduction: str = "mean", label_smoothing: PyFloat = 0.0,
                    weight: Tensor | None = None, ignore_index: PyInt = -100) -> Tensor:
    """Cross-entropy of logits (N, C, ...) (class dim 1) against class indices or class probabilities (same shape as
    the logits), with torch's `label_smoothing`, `weight` and `ignore_index` semantics.

    >>> round(Tensor([[0.0, 0.0]]).cross_entropy(Tensor([1])).item(), 5)
    0.69315
    """
    logp = self.log_softmax(1 if self.ndim > 1 else 0)
    if dtypes.is_int(Y.dtype): return logp.nll_loss(Y, weight, ignore_index, reduction, label_smoothing)
    if Y.shape != self.shape:
      raise ShapeError(f"cross_entropy: probability targets {Y.shape} must match logits {self.shape}")
    cdim = 1 if self.ndim > 1 else 0
    c = int_size(self.shape[cdim], "cross_entropy")
    y = Y * (1 - label_smoothing) + label_smoothing / c
    if weight is not None: logp = logp * weight.reshape(c, *([1] * (self.ndim - cdim - 1)))
    loss = -(y * logp).sum(cdim)
    return loss.sum() / (int(prod(loss.shape)) or 1) if reduction == "mean" else loss._reduce_loss(reduction)
  def sparse_categorical_crossentropy(self: Tensor, Y: Tensor, ignore_index: PyInt = -1, label_smoothing: PyFloat = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits (..., C) (class dim last) against int class indices Y (...); targets equal to
    `ignore_index` are skipped and the mean is over the others.

    >>> round(Tensor([[0.0, 0.0]]).sparse_categorical_crossentropy(Tensor([0])).item(), 5)
    0.69315
    """
    x = self.reshape(-1, self.shape[-1]) if self.ndim != 2 else self
    loss = x.cross_entropy(Y.flatten(), reduction, label_smoothing, ignore_index=ignore_index)
    return loss.reshape(Y.shape) if reduction == "none" else loss

def _conv_grad(g: Tensor, x: Tensor, w: Tensor, *, stride: tuple[int, ...], dilation: tuple[int, ...],
               pads: tuple[tuple[int, int], ...]) -> tuple[Tensor | None, Tensor | None]:
  """Gradients of `conv2d(x, w)` (groups 1; x padded by `pads`) for the output gradient `g` (N, Cout, *out): the
  input's is a transposed convolution of g, the weight's a convolution of x's channels with g's batch as channels."""
  size = int_shape(x.shape[2:], "conv2d")  # the implicit path takes int shapes only
  kernel, out_sp = int_shape(w.shape[2:], "conv2d"), int_shape(g.shape[2:], "conv2d")
  padded = [s + b + a for s, (b, a) in zip(size, pads)]
  dt = least_upper_dtype(x.dtype, w.dtype)
  dx = None
  if dtypes.is_float(x.dtype):
    # the transposed convolution covers the padded input but for the rows a stride left out at its far end
    extra = [p - ((o - 1) * s + d * (k - 1) + 1) for p, o, s, d, k in zip(padded, out_sp, stride, dilation, kernel)]
    full = g.cast(dt).conv_transpose2d(w.cast(dt), stride=stride, dilation=dilation, output_padding=0)
    full = full.pad(((0, 0), (0, 0), *((0, e) for e in extra)))
    dx = full.shrink(((0, full.shape[0]), (0, full.shape[1]),
                      *((b, b + s) for (b, _), s in zip(pads, size)))).cast(x.dtype)
  # dw[co, ci, *k] = sum over n and out of g[n, co, *out] * x_padded[n, ci, out * stride + k * dilation]
  xp = x.cast(dt).pad(((0, 0), (0, 0), *pads)).transpose(0, 1)  # (Cin, N, *padded)
  dw = xp.conv2d(g.cast(dt).transpose(0, 1), stride=dilation, dilation=stride)  # (Cin, Cout, >= *kernel)
  dw = dw.shrink(((0, dw.shape[0]), (0, dw.shape[1]), *((0, k) for k in kernel))).transpose(0, 1).cast(w.dtype)
  return dx, dw

