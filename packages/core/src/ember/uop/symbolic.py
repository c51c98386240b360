"""Symbolic simplification: constant folding, canonical forms and value-range folding of index math.

Movement ops become index expressions like `((r0*12+r1*4+r2)//4)%3`; these rules fold them back to `r1` using each
node's value range (`vmin`/`vmax`). All rules are algebraic identities valid for the node's dtype.
"""
from __future__ import annotations
import math
from typing import Any, cast
from ember.dtype import DType, dtypes, PtrDType
from ember.uop.ops import Ops, UOp, GroupOp, exec_alu, bitcast_value, _cdiv
from ember.uop.rewrite import UPat, PatternMatcher

def _is_int(u: UOp) -> bool: return not isinstance(u.dtype, PtrDType) and dtypes.is_int(u.dtype)

# ** constant folding **

def fold_alu(x: UOp) -> UOp | None:
  for s in x.src:  # a loop, not all(...): this is tried on every ALU node a rewrite walks
    if s.op is not Ops.CONST: return None
  if x.dtype.weak and x.op in GroupOp.Transcendental: return None
  try: return UOp.const(x.dtype, exec_alu(x.op, cast(DType, x.dtype), tuple(s.arg for s in x.src)))
  except (OverflowError, ZeroDivisionError, ValueError): return None

def fold_cast(c: UOp, x: UOp) -> UOp | None:
  if isinstance(x.dtype, PtrDType): return None
  return UOp.const(x.dtype, c.arg)

def fold_bitcast(c: UOp, x: UOp) -> UOp | None:
  try: return UOp.const(x.dtype, bitcast_value(c.arg, cast(DType, c.dtype), cast(DType, x.dtype)))
  except Exception:  # noqa: BLE001  dtypes without a struct format stay unfolded
    return None

def fold_by_range(x: UOp) -> UOp | None:
  """A node whose value range is a single value is that constant (ints and bools only)."""
  if x.op is Ops.CONST or isinstance(x.dtype, PtrDType) or dtypes.is_float(x.dtype) or x.dtype is dtypes.void:
    return None
  if x.op in (Ops.DEFINE_VAR, Ops.BIND, Ops.LOAD, Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX,
              Ops.REDUCE, Ops.SHUFFLE_XOR):
    return None
  lo, hi = x._min_max
  if lo is None or lo != hi: return None
  return UOp.const(x.dtype, lo)

# ** sums of terms: the heart of index simplification **

def split_terms(x: UOp) -> list[UOp]:
  """The addends of a nested ADD, left to right."""
  if x.op is not Ops.ADD: return [x]
  terms: list[UOp] = []
  stack = [x]
  while stack:
    if (n := stack.pop()).op is Ops.ADD: stack += (n.src[1], n.src[0])
    else: terms.append(n)
  return terms

def term_factor(t: UOp) -> tuple[UOp | None, int]:
  """A term as (variable part, integer coefficient); a constant is (None, value)."""
  if t.op is Ops.CONST: return None, t.arg
  if t.op is Ops.MUL and t.src[1].op is Ops.CONST: return t.src[0], t.src[1].arg
  return t, 1

def build_sum(dtype: Any, parts: list[tuple[UOp | None, int]]) -> UOp:
  const = sum(c for v, c in parts if v is None)
  terms = [v if c == 1 else v * UOp.const(dtype, c) for v, c in parts if v is not None and c != 0]
  ret: UOp | None = None
  for t in terms: ret = t if ret is None else ret + t
  if ret is None: return UOp.const(dtype, const)
  return ret + UOp.const(dtype, const) if const != 0 else ret

def combine_terms(x: UOp) -> UOp | None:
  """Collect like terms of an int sum: `a*2 + b + a*3 + 4 + 1` -> `a*5 + b + 5`."""
  a, b = x.src
  if a.op is not Ops.ADD and b.op is not Ops.ADD and (a.op is not Ops.CONST or b.op is Ops.CONST):
    # two terms (most sums a rewrite meets), the constant if any last: nothing to do unless they are like terms
    if term_factor(a)[0] is not term_factor(b)[0]: return None
  terms = split_terms(x)
  if len(terms) < 2: return None
  coeffs: dict[UOp | None, int] = {}
  for t in terms:
    v, c = term_factor(t)
    coeffs[v] = coeffs.get(v, 0) + c
  if len(coeffs) == len(terms) and (None not in coeffs or terms[-1].op is Ops.CONST): return None
  return build_sum(x.dtype, [(v, c) for v, c in coeffs.items()])

def fold_div(x: UOp, c: UOp) -> UOp | None:
  """`(a*k*c + b) // c -> a*k + b//c` when every part is non-negative; then range folds finish `b//c`."""
  d = c.arg
  if d <= 0 or x.vmin < 0: return None
  if x.vmax < d: return x.const_like(0)
  terms = [term_factor(t) for t in split_terms(x)]
  if any(v is not None and (v.vmin < 0 or k < 0) for v, k in terms): return None
  if any(v is None and k < 0 for v, k in terms): return None
  quotient = [(v, k // d) for v, k in terms if k % d == 0]
  rest = [(v, k) for v, k in terms if k % d != 0]
  if not quotient:
    # common factor: (a*4 + b*2) // 6 -> (a*2 + b) // 3
    g = math.gcd(d, *(k for _, k in rest))
    if g > 1 and g != d: return build_sum(x.dtype, [(v, k // g) for v, k in rest]) // x.const_like(d // g)
    # the constant part moves out when the variable part cannot carry past it: (a*d + r + k) // d
    return None
  rest_sum = build_sum(x.dtype, rest)
  rest_q = rest_sum // c if rest else None
  qsum = build_sum(x.dtype, quotient)
  return qsum if rest_q is None else qsum + rest_q

def fold_mod(x: UOp, c: UOp) -> UOp | None:
  """`(a*k*c + b) % c -> b % c` when every part is non-negative; `b % c -> b` when 0 <= b < c."""
  d = c.arg
  if d <= 0 or x.vmin < 0: return None
  if x.vmax < d: return x
  if d == 1: return x.const_like(0)
  terms = [term_factor(t) for t in split_terms(x)]
  if any(v is not None and v.vmin < 0 for v, k in terms): return None
  kept = [(v, k % d) for v, k in terms if k % d != 0]
  if len(kept) == len(terms) and all(k == k2 for (_, k), (_, k2) in zip(kept, terms)): return None  # unchanged
  if not kept: return x.const_like(0)
  return build_sum(x.dtype, kept) % c

def fold_nested_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """`(x // c1) // c2 -> x // (c1*c2)` for non-negative x and positive constants."""
  if x.vmin < 0 or c1.arg <= 0 or c2.arg <= 0: return None
  return x // x.const_like(c1.arg * c2.arg)

def fold_mod_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """`(x % (c2*k)) // c2 -> (x // c2) % k` for non-negative x."""
  if x.vmin < 0 or c2.arg <= 0 or c1.arg % c2.arg != 0: return None
  return (x // c2) % x.const_like(c1.arg // c2.arg)

def fold_mod_mod(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """`(x % (c2*k)) % c2 -> x % c2` for non-negative x."""
  if x.vmin < 0 or c2.arg <= 0 or c1.arg % c2.arg != 0: return None
  return x % c2

def fold_cmp_mul(x: UOp, c0: UOp, c1: UOp) -> UOp | None:
  """`x*c0 < c1 -> x < ceil(c1/c0)` for c0 > 0; for c0 < 0 the sign moves to x: `(x*-1) < ceil(c1/|c0|)`."""
  if not _is_int(x) or c0.arg in (0, 1, -1): return None
  a, b = abs(c0.arg), c1.arg
  bound = -(-b // a)
  lhs = x if c0.arg > 0 else x * x.const_like(-1)
  return lhs.lt(lhs.const_like(bound))

def fold_cmp_div(x: UOp, d: UOp, c: UOp) -> UOp | None:
  """`x//d < c -> x < c*d` for non-negative x, positive d."""
  if x.vmin < 0 or d.arg <= 0: return None
  return x.lt(x.const_like(c.arg * d.arg))

def fold_cmp_add(x: UOp, c0: UOp, c1: UOp) -> UOp | None:
  """`x + c0 < c1 -> x < c1 - c0` (ints)."""
  if not _is_int(x): return None
  return x.lt(x.const_like(c1.arg - c0.arg))

def fold_cmp_range(x: UOp, y: UOp) -> UOp | None:
  """A comparison decided by the operands' value ranges is a constant."""
  if x.vmin is None or y.vmin is None or isinstance(x.dtype, PtrDType): return None
  if dtypes.is_float(x.dtype): return None
  if x.vmax < y.vmin: return UOp.const(dtypes.bool, True)
  if x.vmin >= y.vmax: return UOp.const(dtypes.bool, False)
  return None

def canonical_order(x: UOp) -> UOp | None:
  """Constants go to the right of commutative ops: `2+a -> a+2`."""
  if x.src[0].op is Ops.CONST and x.src[1].op is not Ops.CONST: return x.replace(src=(x.src[1], x.src[0]))
  return None

def fold_mul_add(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
  """`(x + c1) * c2 -> x*c2 + c1*c2` (ints): keeps sums flat so div/mod folding sees every term."""
  if not _is_int(x): return None
  return x * c2 + x.const_like(c1.arg * c2.arg)

def fold_assoc_const(x: UOp, c1: UOp, c2: UOp, op: UOp) -> UOp | None:
  """`(x op c1) op c2 -> x op (c1 op c2)` for associative ops; floats only for MAX (exact)."""
  if dtypes.is_float(x.dtype) and op.op is not Ops.MAX: return None
  return x.alu(op.op, x.const_like(exec_alu(op.op, cast(DType, x.dtype), (c1.arg, c2.arg))))

def fold_assoc_sum(x: UOp, c1: UOp, y: UOp) -> UOp | None:
  """`(x + c) + y -> (x + y) + c` (ints): constants bubble to the outside of a sum."""
  if not _is_int(x) or y.op is Ops.CONST: return None
  return (x + y) + c1

def fold_max_range(x: UOp, y: UOp) -> UOp | None:
  if x.vmin is None or y.vmin is None or dtypes.is_float(x.dtype): return None
  if x.vmin >= y.vmax: return x
  if y.vmin >= x.vmax: return y
  return None

symbolic_simple = PatternMatcher([
  # ** constant folding **
  (UPat(GroupOp.ALU, name="x"), fold_alu),
  (UPat(Ops.CAST, src=(UPat.cvar("c"),), name="x"), fold_cast),
  (UPat(Ops.BITCAST, src=(UPat.cvar("c"),), name="x"), fold_bitcast),
  (UPat(Ops.CAST, name="x"), lambda x: x.src[0] if x.src[0].dtype is x.dtype else None),  # cast to own dtype
  # ** identities **
  (UPat.var("x") + 0, lambda x: x),  # x+0 -> x
  (UPat.var("x") * 1, lambda x: x),  # x*1 -> x
  # x*0 -> 0 (ints)
  (UPat.var("x", dtype=(dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
                        dtypes.uint32, dtypes.uint64, dtypes.weakint, dtypes.bool)) * 0, lambda x: x.const_like(0)),
  (UPat.var("x") // 1, lambda x: x),  # x//1 -> x
  (UPat.var("x") % 1, lambda x: x.const_like(0) if _is_int(x) else None),  # x%1 -> 0
  # x//x -> 1 (ints, x never 0)
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.var("y"))),
   lambda x, y: x.const_like(1) if x is y and _is_int(x) and (x.vmin > 0 or x.vmax < 0) else None),
  (UPat(Ops.AND, src=[UPat.var("x"), UPat.const(dtypes.bool, True)]), lambda x: x),  # x & True -> x
  # x & False -> False
  (UPat(Ops.AND, src=[UPat.var("x"), UPat.const(dtypes.bool, False)]), lambda x: x.const_like(False)),
  (UPat(Ops.OR, src=[UPat.var("x"), UPat.const(dtypes.bool, False)]), lambda x: x),  # x | False -> x
  (UPat(Ops.OR, src=[UPat.var("x"), UPat.const(dtypes.bool, True)]), lambda x: x.const_like(True)),  # x | True -> True
  (UPat(Ops.AND, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),  # x & x -> x
  (UPat(Ops.OR, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),  # x | x -> x
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),  # max(x, x) -> x
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(UPat.var("x"), UPat.const(dtypes.bool, True))),
                        UPat.const(dtypes.bool, True))), lambda x: x),  # !!x -> x
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: x),  # --x -> x
  # ** where **
  # where(True, a, b) -> a
  (UPat(Ops.WHERE, src=(UPat.const(dtypes.bool, True), UPat.var("a"), UPat.var())), lambda a: a),
  # where(False, a, b) -> b
  (UPat(Ops.WHERE, src=(UPat.const(dtypes.bool, False), UPat.var(), UPat.var("b"))), lambda b: b),
  # where(c, a, a) -> a
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if a is b else None),
])

symbolic = symbolic_simple + PatternMatcher([
  # ** canonical forms **
  (UPat(GroupOp.Commutative, name="x"), canonical_order),
  # (x+c1)+c2 -> x+(c1+c2)
  (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))),
   lambda x, c1, c2: x + x.const_like(c1.arg + c2.arg) if not dtypes.is_float(x.dtype) else None),
  # (x*c1)*c2 -> x*(c1*c2)
  (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))),
   lambda x, c1, c2: x * x.const_like(c1.arg * c2.arg) if not dtypes.is_float(x.dtype) else None),
  # (x+c1)*c2 -> x*c2+c1*c2
  (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))), fold_mul_add),
  (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), UPat.cvar("c"))),
   lambda x, y, c: x * c + y * c if _is_int(x) and y.op is not Ops.CONST else None),  # (x+y)*c -> x*c+y*c (ints)
  # (x+c)+y -> (x+y)+c
  (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.var("y"))), fold_assoc_sum),
  (UPat(Ops.MAX, src=(UPat(Ops.MAX, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2")), name="op"),
   lambda x, c1, c2, op: fold_assoc_const(x, c1, c2, op)),
  (UPat(Ops.ADD, name="x", dtype=(dtypes.int32, dtypes.int64, dtypes.weakint, dtypes.int16, dtypes.int8, dtypes.uint32,
                                  dtypes.uint64)), combine_terms),  # a*2 + a*3 -> a*5
  # ** div and mod **
  (UPat(Ops.ADD, src=[UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), UPat.cvar("c2"))),
                      UPat(Ops.MOD, src=(UPat.var("x2"), UPat.cvar("c3")))]),
   # (x//c)*c + x%c -> x
   lambda x, c, c2, x2, c3: x if x is x2 and c.arg == c2.arg == c3.arg and x.vmin >= 0 else None),
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: fold_div(x, c) if _is_int(x) else None),
  (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: fold_mod(x, c) if _is_int(x) else None),
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))), fold_nested_div),
  (UPat(Ops.IDIV, src=(UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))), fold_mod_div),
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))), fold_mod_mod),
  # ** comparisons **
  (UPat(Ops.CMPLT, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c0"))), UPat.cvar("c1"))), fold_cmp_mul),
  (UPat(Ops.CMPLT, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("d"))), UPat.cvar("c"))), fold_cmp_div),
  (UPat(Ops.CMPLT, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c0"))), UPat.cvar("c1"))), fold_cmp_add),
  (UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("y"))), fold_cmp_range),
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))), fold_max_range),
  # ** value ranges **
  (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), fold_by_range),
])

def sym_infer(u: UOp | int, var_vals: dict[str, int]) -> int:
  """Evaluate a symbolic int expression with concrete variable values."""
  if isinstance(u, int): return u
  if u.op is Ops.CONST: return u.arg
  if u.op is Ops.DEFINE_VAR: return var_vals[u.arg[0]]
  if u.op is Ops.BIND: return u.src[1].arg
  vals = tuple(sym_infer(s, var_vals) for s in u.src)
  if u.op is Ops.IDIV: return _cdiv(vals[0], vals[1])
  return exec_alu(u.op, cast(DType, u.dtype), vals)
