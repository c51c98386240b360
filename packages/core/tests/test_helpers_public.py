"""The public helpers tinygrad programs import, from ember.helpers: GlobalCounters, Timing, tqdm/trange, colored and
the small utilities."""
from __future__ import annotations
import io
import re
import time
import numpy as np
import pytest
import ember
from ember import Tensor, TinyJit
from ember.helpers import (Context, GlobalCounters, Timing, all_int, all_same, ansilen, ansistrip, argfix, colored,
                           dedup, fully_flatten, getenv, make_tuple, partition, round_up, tqdm, trange, unwrap)

def test_root_and_helpers_export_the_same_objects():
  assert ember.GlobalCounters is GlobalCounters and ember.Context is Context and ember.getenv is getenv
  from ember.engine.realize import GlobalCounters as engine_counters
  assert engine_counters is GlobalCounters

def test_global_counters_count_kernels_ops_and_memory():
  a, b = Tensor(np.ones((64, 64), np.float32)).realize(), Tensor(np.ones((64, 64), np.float32)).realize()
  GlobalCounters.reset()
  (a @ b).realize()
  assert GlobalCounters.kernel_count >= 1
  assert GlobalCounters.global_ops >= 2 * 64 ** 3  # a multiply and an add per term
  assert GlobalCounters.global_mem >= 3 * 64 * 64 * 4  # two inputs read, one output written
  with Context(DEBUG=2):
    GlobalCounters.reset()
    (a + 1).realize()
  assert GlobalCounters.time_sum_s > 0
  GlobalCounters.reset()
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem,
          GlobalCounters.time_sum_s) == (0, 0, 0, 0.0)

def test_global_counters_count_jit_replays():
  step = TinyJit(lambda x: (x * 2 + 1).realize())
  x = Tensor(np.ones(8, np.float32)).realize()
  for _ in range(3): step(x)
  GlobalCounters.reset()
  step(x)
  assert GlobalCounters.kernel_count == len(step.captured) >= 1

def test_timing_writes_elapsed_ms():
  out = io.StringIO()
  with Timing("step: ", on_exit=lambda ns: f" ({ns} ns)", file=out) as t:
    time.sleep(0.01)
  m = re.fullmatch(r"step: +(\d+\.\d\d) ms \((\d+) ns\)\n", out.getvalue())
  assert m is not None and float(m.group(1)) >= 10.0 and int(m.group(2)) == t.et
  quiet = io.StringIO()
  with Timing(enabled=False, file=quiet): pass
  assert quiet.getvalue() == ""
  @Timing("call ", file=out)
  def f() -> int: return 3
  assert f() == 3 and out.getvalue().count(" ms") == 2

def test_trange_and_tqdm_yield_everything_and_draw_a_bar():
  out = io.StringIO()
  assert list(trange(5, desc="train", file=out)) == [0, 1, 2, 3, 4]
  last = ansistrip(out.getvalue()).split("\r")[-1]
  assert last.startswith("train: 100%|") and "5/5" in last and last.endswith("\n")
  out = io.StringIO()
  with tqdm(total=10, file=out, unit="img") as bar:
    bar.update(4)
    bar.set_description("eval")
    bar.update(6)
  assert "10/10" in out.getvalue() and "img/s" in out.getvalue()
  out = io.StringIO()
  assert list(tqdm(iter("ab"), file=out)) == ["a", "b"] and "2it" in out.getvalue()  # no length: a count
  silent = io.StringIO()
  assert sum(tqdm(range(3), disable=True, file=silent)) == 3 and silent.getvalue() == ""
  with pytest.raises(TypeError, match="iterable"): list(tqdm(total=3, file=io.StringIO()))

def test_colored_and_utilities():
  assert colored("x", "red") == "\x1b[31mx\x1b[0m" and colored("x", "RED") == "\x1b[91mx\x1b[0m"
  assert colored("x", "black", background=True) == "\x1b[40mx\x1b[0m" and colored("x", None) == "x"
  assert ansistrip(colored("abc", "green")) == "abc" and ansilen(colored("abc", "GREEN")) == 3
  with pytest.raises(ValueError, match="unknown color"): colored("x", "orange")
  assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2] and all_same([1, 1]) and not all_same([1, 2]) and all_same([])
  assert all_int((1, 2)) and not all_int((1, 2.0))
  assert argfix(1, 2) == (1, 2) == argfix((1, 2)) == argfix([1, 2])
  with pytest.raises(ValueError): argfix((1,), 2)
  assert make_tuple(3, 2) == (3, 3) and make_tuple([1, 2], 2) == (1, 2)
  assert fully_flatten([1, [2, (3, [4])]]) == [1, 2, 3, 4] and round_up(10, 4) == 12
  assert partition([1, 2, 3, 4], lambda x: x % 2 == 0) == ([2, 4], [1, 3])
  assert unwrap(5) == 5
  with pytest.raises(ValueError): unwrap(None)
