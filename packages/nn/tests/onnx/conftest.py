"""Shared fixtures of the ONNX importer's tests: exporting torch modules to ONNX bytes and running ONNX Runtime, the
oracle every model test compares against."""
from __future__ import annotations
import io
from typing import Any, Callable
import numpy as np
import pytest

@pytest.fixture
def export() -> Callable[..., bytes]:
  """export(module, args, input_names, output_names, dynamic_axes=None) -> the ONNX bytes torch.onnx writes (its
  TorchScript exporter: the dynamo one needs onnxscript)."""
  torch = pytest.importorskip("torch")
  def run(module: Any, args: tuple[Any, ...], input_names: list[str], output_names: list[str],
          dynamic_axes: dict[str, Any] | None = None, opset: int = 17) -> bytes:
    buf = io.BytesIO()
    module.eval()
    with torch.no_grad():
      torch.onnx.export(module, args, buf, input_names=input_names, output_names=output_names, opset_version=opset,
                        dynamic_axes=dynamic_axes, dynamo=False)
    return buf.getvalue()
  return run

@pytest.fixture
def ort_run() -> Callable[[bytes, dict[str, np.ndarray]], dict[str, np.ndarray]]:
  """ort_run(model_bytes, feeds) -> {output name: array} from ONNX Runtime's CPU provider."""
  ort = pytest.importorskip("onnxruntime")
  def run(model: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return dict(zip((o.name for o in sess.get_outputs()), sess.run(None, feeds)))
  return run
