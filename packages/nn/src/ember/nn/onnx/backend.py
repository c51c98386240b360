"""An `onnx.backend.base.Backend` for ember, so ONNX's conformance suite (`onnx.backend.test`) and other tools built on
that interface run models on ember: `EmberBackend.prepare(model, "CPU").run([inputs...])` returns numpy outputs.

>>> import onnx.backend.test                                          # doctest: +SKIP
>>> suite = onnx.backend.test.BackendTest(EmberBackend, __name__)     # doctest: +SKIP
"""
from __future__ import annotations
from typing import Any, Sequence
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep
from ember import Tensor
from ember.nn.onnx.model import OnnxModel, load_proto

def _to_numpy(value: Any, want: np.dtype | None) -> Any:
  if value is None: return None
  if isinstance(value, list): return [_to_numpy(v, want) for v in value]
  arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
  # bfloat16/fp8 come back as float32 (numpy has no such types): hand them over in the type the model declares
  return arr.astype(want) if want is not None and arr.dtype != want and want.kind == "V" or \
    (want is not None and str(want) in ("bfloat16", "float8_e4m3fn", "float8_e5m2")) else arr

class EmberRep(BackendRep):
  """A prepared model: `run(inputs)` feeds the graph inputs in declaration order and returns outputs in order."""
  def __init__(self, model: OnnxModel):
    self.model = model
    self.out_types: list[np.dtype | None] = []
    for vi in model.proto.graph.output:
      tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
      try: self.out_types.append(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt is not None else None)
      except (KeyError, ValueError, TypeError): self.out_types.append(None)

  def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
    names = [i.name for i in self.model.inputs]
    if isinstance(inputs, dict): feeds = dict(inputs)
    else:
      seq = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
      feeds = dict(zip(names, seq))
    outputs = self.model(**feeds)
    return tuple(_to_numpy(v, t) for v, t in zip(outputs.values(), self.out_types))

class EmberBackend(Backend):
  """ember as an ONNX backend. `device` is an ONNX device name ("CPU"); the model runs on ember's default device
  (`DEV=`), or on `ember_device=` when given."""
  @classmethod
  def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> EmberRep:
    return EmberRep(load_proto(model, kwargs.get("ember_device")))

  @classmethod
  def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
    return cls.prepare(model, device, **kwargs).run(inputs)

  @classmethod
  def supports_device(cls, device: str) -> bool: return device == "CPU"

def run_model(model: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> tuple[Any, ...]:
  return EmberBackend.run_model(model, inputs)
