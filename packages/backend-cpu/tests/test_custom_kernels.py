"""Hand-written kernels (Tensor.custom_kernel, examples/custom_*.py) on the CPU with both renderers, C and LLVM IR: the
example kernels against numpy, a kernel written as C source with its compiled binary (behaviour 30 of the seeds), and
the one-kernel softmax's loop over rows split over the cores."""
from __future__ import annotations
from pathlib import Path
from typing import Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Context, Tensor, UOp
from ember.codegen import get_program
from ember.device import Device
from ember.testing.custom_kernels import check_custom_kernels, load_example, placeholders
from ember.tensor_ops.custom import _named
from ember.uop.ops import KernelInfo, Ops

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
pytestmark = pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"{EXAMPLES} is absent (examples/ lives at the root)")

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param): yield "CPU"

def test_example_kernels_match_numpy(cpu: str) -> None:
  check_custom_kernels(cpu, EXAMPLES)

def test_kernel_from_c_source_and_binary() -> None:  # behaviour 30
  a = Tensor.arange(4, device="CPU").clone().realize()
  src = ('void test_src(int* restrict a, const int core_id, const int num_cores) { a[0] = 1; }\n'
         'const char test_src_argfmt[] = "Pii";\n')
  binary = Device["CPU"].compiler.compile(src)
  def custom_src_kernel(buf: UOp) -> UOp:
    sink = UOp.sink(buf, arg=KernelInfo(name="test_src"))
    return UOp(Ops.PROGRAM, src=(sink, UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=binary)))
  assert Tensor.custom_kernel(a.reshape(2, 2).T, fxn=custom_src_kernel)[0].tolist() == [[1, 2], [1, 3]]
  # without a binary the device's compiler compiles the source
  def source_only(buf: UOp) -> UOp:
    return UOp(Ops.PROGRAM, src=(UOp.sink(buf, arg=KernelInfo(name="test_src")), UOp(Ops.SOURCE, arg=src)))
  assert Tensor.custom_kernel(Tensor.arange(3, device="CPU").clone(), fxn=source_only)[0].tolist() == [1, 1, 2]

def test_softmax_rows_split_over_threads() -> None:
  softmax = load_example(EXAMPLES, "custom_softmax")
  bufs = [np.zeros((256, 1024), np.float32)] * 2
  with Context(NUM_CPU_THREADS=4):
    spec = get_program(_named(softmax.softmax_kernel(*placeholders(bufs)), softmax.softmax_kernel),
                       Device["CPU"].renderer)
  assert spec.global_size == [4, 1, 1] and "core_id*" in spec.src
  x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
  e = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(softmax.custom_softmax(Tensor(x, device="CPU")).numpy(), e / e.sum(1, keepdims=True),
                             rtol=1e-5, atol=1e-8)

def test_debug_4_prints_a_custom_kernels_source(capsys: pytest.CaptureFixture[str]) -> None:
  """DEBUG=4 prints each kernel's source when it is built, the hand-written ones too (docs/debugging.md)."""
  softmax = load_example(EXAMPLES, "custom_softmax")
  bufs = [np.zeros((3, 48), np.float32)] * 2
  capsys.readouterr()
  with Context(DEBUG=4): spec = get_program(_named(softmax.softmax_kernel(*placeholders(bufs)), softmax.softmax_kernel),
                                            Device["CPU"].renderer)
  assert spec.src.strip() and spec.src.strip() in capsys.readouterr().err
