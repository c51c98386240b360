"""The typed errors of the ONNX importer. Each names the node (its name, op and the opset the model imports) so a
failure in a graph of thousands of nodes points at the one that did not fit."""
from __future__ import annotations
from ember.errors import EmberError

class OnnxError(EmberError, ValueError):
  """The model is malformed or its inputs do not fit it (a missing input, an input of the wrong shape, a node that
  reads a value nothing produced). ValueError, as onnxruntime's INVALID_ARGUMENT."""

class UnsupportedOpError(EmberError, NotImplementedError):
  """An op, an op version or an attribute value that ember.nn.onnx does not implement. NotImplementedError, the builtin
  onnx.backend's runner and onnxruntime's NOT_IMPLEMENTED map to."""

def where(node_name: str, op_type: str, domain: str, opset: int) -> str:
  """How errors name a node: `node 'conv1' (Conv, ai.onnx opset 13)`."""
  return f"node {node_name!r} ({op_type}, {domain or 'ai.onnx'} opset {opset})"
