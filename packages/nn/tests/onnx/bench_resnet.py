"""The ResNet-18-shaped CNN of test_models.py (torchvision's layout, random init) exported with torch.onnx, timed on
ember (under TinyJit, DEV's device) next to ONNX Runtime's CPU provider in the same run, at batch 1 and 16.

  DEV=CPU python packages/nn/tests/onnx/bench_resnet.py [--size 224] [--runs 5]

Each row is the median of --runs warm runs (after TinyJit has captured the model). Issue 20's goal: ember within
1.5x of ONNX Runtime at batch 16."""
from __future__ import annotations
import argparse
import io
import os
import sys
import tempfile
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_models import resnet  # noqa: E402
from ember import Device  # noqa: E402
from ember.nn.onnx import load  # noqa: E402
from ember.nn.onnx.__main__ import benchmark  # noqa: E402

def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", type=int, default=224, help="image height and width")
  parser.add_argument("--width", type=int, default=64, help="channels of the first stage (torchvision's: 64)")
  parser.add_argument("--runs", type=int, default=5)
  parser.add_argument("--batches", default="1,16")
  args = parser.parse_args()
  model = resnet(args.width, 1000)
  print(f"ResNet-18-shaped CNN, width {args.width}, {args.size}x{args.size}, on ember {Device.DEFAULT} and "
        f"onnxruntime CPU ({os.cpu_count()} cores), median of {args.runs}")
  for batch in (int(b) for b in args.batches.split(",")):
    x = np.random.default_rng(0).standard_normal((batch, 3, args.size, args.size)).astype(np.float32)
    buf = io.BytesIO()
    with torch.no_grad():
      torch.onnx.export(model, (torch.from_numpy(x),), buf, input_names=["image"], output_names=["logits"],
                        opset_version=17, dynamo=False)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "resnet.onnx")
      with open(path, "wb") as f: f.write(buf.getvalue())
      lines = benchmark(load(path), path, {"image": x}, args.runs)
    print(f"  batch {batch:3d}: " + "; ".join(lines))
  return 0

if __name__ == "__main__":
  sys.exit(main())
