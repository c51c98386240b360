"""ember.nn.onnx: run ONNX models (torch.onnx, tf2onnx, the model zoos) as ember Tensor graphs on any ember device.

>>> from ember.nn import onnx as eonnx                               # doctest: +SKIP
>>> model = eonnx.load("model.onnx")                                  # doctest: +SKIP
>>> out = model(input=np.zeros((1, 3, 224, 224), np.float32))        # doctest: +SKIP

Parsing needs the `onnx` package (`pip install 'ember-nn[onnx]'`). docs/onnx.md lists the supported ops, the
conformance-suite pass count and every known gap.
"""
from ember.nn.onnx.errors import OnnxError, UnsupportedOpError
from ember.nn.onnx.model import OnnxModel, ValueSpec, load

__all__ = ["OnnxError", "OnnxModel", "UnsupportedOpError", "ValueSpec", "load"]
