"""`python -m ember.nn.onnx MODEL.onnx [--input name=file.npy ...] [--benchmark] [--runs N]`: run an ONNX model on
ember's default device (DEV=) and print each output's name, shape and dtype. Inputs not given are filled with seeded
random values of the declared shape (a symbolic dim becomes 1). `--benchmark` times the model (median of --runs warm
runs, after TinyJit has captured it) next to ONNX Runtime's CPU time when onnxruntime is installed."""
from __future__ import annotations
import argparse
import statistics
import sys
import time
from typing import Any
import numpy as np
from ember import Device, Tensor, TinyJit
from ember.nn.onnx.errors import OnnxError
from ember.nn.onnx.model import OnnxModel, ValueSpec, load

def _random_input(spec: ValueSpec, rng: np.random.Generator) -> np.ndarray:
  if spec.kind != "tensor" or spec.dtype is None or spec.shape is None:
    raise OnnxError(f"input {spec.name!r} is a {spec.kind} without a known tensor shape; pass it with "
                    f"--input {spec.name}=FILE.npy")
  shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
  np_dtype = np.dtype(spec.dtype.fmt) if spec.dtype.fmt is not None else np.dtype(np.float32)
  if np_dtype.kind == "f": return rng.standard_normal(shape).astype(np_dtype)
  if np_dtype.kind == "b": return rng.integers(0, 2, shape).astype(np.bool_)
  return rng.integers(0, 2, shape).astype(np_dtype)

def parse_inputs(model: OnnxModel, given: list[str]) -> dict[str, np.ndarray]:
  feeds: dict[str, np.ndarray] = {}
  for item in given:
    name, sep, path = item.partition("=")
    if not sep: raise OnnxError(f"--input {item!r} must be NAME=FILE.npy")
    feeds[name] = np.load(path)
  rng = np.random.default_rng(0)
  for spec in model.inputs:
    if spec.name not in feeds and spec.kind != "optional": feeds[spec.name] = _random_input(spec, rng)
  return feeds

def _median_ms(fn: Any, runs: int) -> float:
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3

def benchmark(model: OnnxModel, path: str, feeds: dict[str, np.ndarray], runs: int) -> list[str]:
  tensors = {k: Tensor(v, device=model.device).realize() for k, v in feeds.items()}
  jitted = TinyJit(lambda **kw: {k: v.realize() for k, v in model(**kw).items()})
  def step() -> None:
    for v in jitted(**tensors).values(): v.numpy()
  for _ in range(3): step()  # the JIT captures on the second call
  lines = [f"ember ({model.device}): {_median_ms(step, runs):.3f} ms (median of {runs})"]
  try: import onnxruntime as ort  # type: ignore[import-untyped]
  except ImportError: return [*lines, "onnxruntime: not installed (pip install onnxruntime for its column)"]
  sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
  sess.run(None, feeds)
  lines.append(f"onnxruntime (CPU): {_median_ms(lambda: sess.run(None, feeds), runs):.3f} ms (median of {runs})")
  return lines

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m ember.nn.onnx", description=__doc__)
  parser.add_argument("model", help="path of the .onnx file")
  parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a .npy file")
  parser.add_argument("--benchmark", action="store_true", help="time the model (and ONNX Runtime, when installed)")
  parser.add_argument("--runs", type=int, default=20, help="timed runs for --benchmark")
  args = parser.parse_args(argv)
  model = load(args.model)
  feeds = parse_inputs(model, args.input)
  outputs = model(**feeds)
  print(f"{args.model} on {Device.DEFAULT}:")
  for name, value in outputs.items():
    if isinstance(value, Tensor): print(f"  {name}: shape {tuple(value.realize().shape)} {value.dtype!r}")
    else: print(f"  {name}: {type(value).__name__} {value if value is None else len(value)}")
  if args.benchmark:
    for line in benchmark(model, args.model, feeds, args.runs): print("  " + line)
  return 0

if __name__ == "__main__":
  sys.exit(main())
