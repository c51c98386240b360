"""Loading an ONNX model and running its graph as ember Tensor ops.

`load` parses the file with the `onnx` package; initializers become Tensors on the chosen device (those kept in
external-data files are read from disk lazily, when first realized); every node is bound to its implementation in the
op table at load time, so an unsupported op fails before anything runs. Calling the model runs the nodes in order on
lazy Tensors: nothing is computed until an output is realized, so a whole model fuses and can run under TinyJit.
"""
from __future__ import annotations
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence
import numpy as np
from ember import Device, Tensor, dtypes
from ember.dtype import DType
from ember.errors import DTypeError, EmberError, ShapeError
from ember.nn.functional import static_shape
from ember.nn.onnx.errors import OnnxError, UnsupportedOpError, where
from ember.nn.onnx.registry import NodeContext, OpImpl, canonical_domain, lookup, versions
from ember.nn.onnx import ops as _ops  # noqa: F401  (fills the op table)

try:
  import onnx
  from onnx import numpy_helper
  from google.protobuf.message import DecodeError  # type: ignore[import-untyped]  # onnx's own dependency
except ImportError as e:  # pragma: no cover - the extra is documented; the error says how to get it
  raise ImportError("ember.nn.onnx parses models with the `onnx` package: pip install 'ember-nn[onnx]'") from e

# TensorProto.DataType -> ember dtype; the types ember has no dtype for (strings, complex, 4-bit, fp8 FNUZ) are absent
ONNX_DTYPES: dict[int, DType] = {
  onnx.TensorProto.FLOAT: dtypes.float32, onnx.TensorProto.UINT8: dtypes.uint8, onnx.TensorProto.INT8: dtypes.int8,
  onnx.TensorProto.UINT16: dtypes.uint16, onnx.TensorProto.INT16: dtypes.int16, onnx.TensorProto.INT32: dtypes.int32,
  onnx.TensorProto.INT64: dtypes.int64, onnx.TensorProto.BOOL: dtypes.bool, onnx.TensorProto.FLOAT16: dtypes.float16,
  onnx.TensorProto.DOUBLE: dtypes.float64, onnx.TensorProto.UINT32: dtypes.uint32,
  onnx.TensorProto.UINT64: dtypes.uint64, onnx.TensorProto.BFLOAT16: dtypes.bfloat16,
  onnx.TensorProto.FLOAT8E4M3FN: dtypes.fp8e4m3, onnx.TensorProto.FLOAT8E5M2: dtypes.fp8e5m2,
}

def to_dtype(onnx_type: int, what: str) -> DType:
  """The ember dtype of an ONNX element type, or a DTypeError naming it and `what` declared it."""
  if (dt := ONNX_DTYPES.get(onnx_type)) is None:
    name = onnx.TensorProto.DataType.Name(onnx_type) if onnx_type in onnx.TensorProto.DataType.values() else onnx_type
    raise DTypeError(f"{what} has ONNX element type {name}, which ember has no dtype for; supported: "
                     f"{', '.join(onnx.TensorProto.DataType.Name(k) for k in ONNX_DTYPES)}")
  return dt

def check_device_dtype(dt: DType, device: str, what: str) -> None:
  """A clear error for a dtype the device's renderer cannot hold (float64 on METAL), before a kernel fails."""
  renderer = getattr(Device[device], "renderer", None)
  if renderer is not None and dt in renderer.unsupported_dtypes:
    raise DTypeError(f"{what} is {dt!r}, which device {device} cannot hold; run the model on a device that has it "
                     f"(DEV=CPU) or convert the model to another dtype")

def tensor_from_proto(tp: onnx.TensorProto, device: str, base_dir: str | None) -> Tensor:
  """A TensorProto as a Tensor on `device`. External data is a lazy view of its file; bfloat16 and fp8 (which numpy
  lacks) travel as float32 and are rounded by the device."""
  dt = to_dtype(tp.data_type, f"tensor {tp.name!r}")
  check_device_dtype(dt, device, f"tensor {tp.name!r}")
  shape = tuple(int(d) for d in tp.dims)
  if tp.data_location == onnx.TensorProto.EXTERNAL and dt.fmt is not None:
    info = {e.key: e.value for e in tp.external_data}
    if base_dir is None:
      raise OnnxError(f"tensor {tp.name!r} keeps its data in {info.get('location')!r}: load the model from its path "
                      "(not from bytes) so the file can be found next to it")
    path = os.path.join(base_dir, info["location"])
    if not os.path.isfile(path): raise OnnxError(f"tensor {tp.name!r}: external data file {path!r} does not exist")
    return Tensor.from_file(path, int(info.get("offset", 0)), shape, dt, device=device)
  if tp.data_location == onnx.TensorProto.EXTERNAL:
    onnx.external_data_helper.load_external_data_for_tensor(tp, base_dir or ".")
  arr = numpy_helper.to_array(tp)
  if dt.fmt is None or arr.dtype.kind not in "biuf?" or arr.dtype.itemsize != dt.itemsize:
    return Tensor(np.asarray(arr, dtype=np.float32).reshape(shape), device=device).cast(dt)
  return Tensor(np.ascontiguousarray(arr).reshape(shape), device=device, dtype=dt)

@dataclass(frozen=True)
class ValueSpec:
  """A graph input or output as the model declares it: a tensor (dtype, dims: int, str for a symbolic dim, None for
  unknown), a sequence of such tensors, or an optional of either."""
  name: str
  kind: str  # "tensor", "sequence", "optional", "other"
  dtype: DType | None
  shape: tuple[int | str | None, ...] | None

def value_spec(vi: onnx.ValueInfoProto) -> ValueSpec:
  tp, kind = vi.type, "tensor"
  if tp.HasField("optional_type"): tp, kind = tp.optional_type.elem_type, "optional"
  if tp.HasField("sequence_type"): tp, kind = tp.sequence_type.elem_type, "sequence" if kind == "tensor" else kind
  if not tp.HasField("tensor_type"): return ValueSpec(vi.name, "other", None, None)
  tt = tp.tensor_type
  dt = ONNX_DTYPES.get(tt.elem_type)
  shape = None if not tt.HasField("shape") else tuple(
    d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
  return ValueSpec(vi.name, kind, dt, shape)

def attribute_value(attr: onnx.AttributeProto, model: OnnxModel) -> Any:
  A = onnx.AttributeProto
  if attr.type == A.FLOAT: return float(attr.f)
  if attr.type == A.INT: return int(attr.i)
  if attr.type == A.STRING: return attr.s.decode("utf-8", errors="replace")
  if attr.type == A.TENSOR: return tensor_from_proto(attr.t, model.device, model.base_dir)
  if attr.type == A.GRAPH: return Graph(attr.g, model)
  if attr.type == A.FLOATS: return [float(f) for f in attr.floats]
  if attr.type == A.INTS: return [int(i) for i in attr.ints]
  if attr.type == A.STRINGS: return [s.decode("utf-8", errors="replace") for s in attr.strings]
  if attr.type == A.TENSORS: return [tensor_from_proto(t, model.device, model.base_dir) for t in attr.tensors]
  if attr.type == A.GRAPHS: return [Graph(g, model) for g in attr.graphs]
  if attr.type == A.TYPE_PROTO: return attr.tp
  if attr.type == A.SPARSE_TENSOR: return attr.sparse_tensor
  raise OnnxError(f"attribute {attr.name!r} has type {A.AttributeType.Name(attr.type)}, which ember cannot read")

@dataclass
class Node:
  name: str
  op_type: str
  domain: str
  opset: int
  inputs: list[str]
  outputs: list[str]
  attrs: dict[str, Any]
  impl: OpImpl | None  # None for a call of a model-local function
  function: Graph | None = None

  @property
  def where(self) -> str: return where(self.name, self.op_type, self.domain, self.opset)

class Graph:
  """A GraphProto (the model's, or an If/Loop/Scan body) with its nodes bound to implementations."""
  def __init__(self, gp: onnx.GraphProto, model: OnnxModel, function: onnx.FunctionProto | None = None):
    self.model = model
    self.name = gp.name if function is None else function.name
    self.initializers: dict[str, Tensor] = {t.name: tensor_from_proto(t, model.device, model.base_dir)
                                            for t in gp.initializer}
    if function is None:
      self.inputs = [value_spec(vi) for vi in gp.input if vi.name not in self.initializers]
      self.outputs = [value_spec(vi) for vi in gp.output]
    else:
      self.inputs = [ValueSpec(n, "any", None, None) for n in function.input]
      self.outputs = [ValueSpec(n, "any", None, None) for n in function.output]
    self.nodes = [self._bind(n, i) for i, n in enumerate(function.node if function is not None else gp.node)]

  def _bind(self, n: onnx.NodeProto, index: int) -> Node:
    domain = canonical_domain(n.domain)
    opset = self.model.opsets.get(domain, 1)
    name = n.name or f"{n.op_type}_{index}"
    attrs = {a.name: attribute_value(a, self.model) for a in n.attribute}
    if (fn := self.model.functions.get((n.domain, n.op_type))) is not None:
      return Node(name, n.op_type, domain, opset, list(n.input), list(n.output), attrs, None, fn)
    impl = lookup(domain, n.op_type, opset)
    if impl is None:
      have = versions(domain, n.op_type)
      why = (f"ember implements it from opset {have[0]} on" if have else
             "ember.nn.onnx does not implement this op") if domain in ("", "com.microsoft") or have else \
            f"ember.nn.onnx implements no ops of domain {domain!r}"
      raise UnsupportedOpError(f"{where(name, n.op_type, domain, opset)} is not supported: {why}; docs/onnx.md lists "
                               "the supported ops")
    return Node(name, n.op_type, domain, opset, list(n.input), list(n.output), attrs, impl)

  def run(self, feeds: Mapping[str, Any], outer: Mapping[str, Any] | None = None) -> list[Any]:
    """Run the nodes on `feeds` (graph input name -> value), reading names it does not define from `outer` (the
    enclosing graph's values, for If/Loop/Scan bodies). Returns the outputs in declaration order."""
    scope: dict[str, Any] = {**(outer or {}), **self.initializers, **feeds, "": None}
    for node in self.nodes:
      missing = [n for n in node.inputs if n not in scope]
      if missing: raise OnnxError(f"{node.where} reads {missing}, which no node, input or initializer produced")
      names = list(node.inputs)
      while names and names[-1] == "": names.pop()  # omitted trailing optional inputs take the op's defaults
      args = [scope[n] for n in names]
      results = self._run_node(node, args, scope)
      for out_name, value in zip(node.outputs, results):
        if out_name: scope[out_name] = value
    return [scope[o.name] for o in self.outputs]

  def _run_node(self, node: Node, args: list[Any], scope: dict[str, Any]) -> list[Any]:
    if node.function is not None:
      return node.function.run(dict(zip((i.name for i in node.function.inputs), args)), {})
    assert node.impl is not None
    kwargs = dict(node.attrs)
    if node.impl.ctx:
      kwargs["ctx"] = NodeContext(node.name, node.op_type, node.outputs, scope, run_subgraph, self.model.device,
                                  self.model.opsets)
    try: _signature(node.impl.fn).bind(*args, **kwargs)
    except TypeError as e:
      if "unexpected keyword argument" in str(e):
        bad = str(e).split("argument")[-1].strip()
        raise UnsupportedOpError(f"{node.where}: attribute {bad} is not supported") from e
      raise OnnxError(f"{node.where} got inputs {node.inputs} and attributes {sorted(node.attrs)}: {e}") from e
    try: out = node.impl.fn(*args, **kwargs)
    except EmberError as e:  # the same error type, the node named first
      if str(e).startswith("node "): raise
      raise type(e)(f"{node.where}: {e}") from e
    except NotImplementedError as e: raise UnsupportedOpError(f"{node.where}: {e}") from e
    except Exception as e:
      e.add_note(f"while running ONNX {node.where}")
      raise
    results = list(out) if isinstance(out, (tuple, list)) and not _is_sequence_op(node) else [out]
    if len(node.outputs) > len(results):
      raise OnnxError(f"{node.where} has {len(node.outputs)} outputs but its implementation gave {len(results)}")
    return results

@functools.lru_cache(maxsize=None)
def _signature(fn: Any) -> inspect.Signature: return inspect.signature(fn)

SEQUENCE_OPS = {"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SplitToSequence", "Optional",
                "OptionalGetElement", "Identity", "SequenceMap"}

def _is_sequence_op(node: Node) -> bool:
  """Ops whose single output may itself be a list (a sequence value), not a list of outputs."""
  return node.op_type in SEQUENCE_OPS and len(node.outputs) == 1

def run_subgraph(graph: Graph, feeds: Sequence[Any], outer: Mapping[str, Any]) -> list[Any]:
  """Run an If/Loop/Scan body: its inputs bound to `feeds` in order, the rest read from the enclosing scope."""
  return graph.run(dict(zip((i.name for i in graph.inputs), feeds)), outer)

class OnnxModel:
  """An ONNX model ready to run on an ember device: `model(**inputs) -> {output name: Tensor}`.

  >>> model = load("resnet.onnx")                                          # doctest: +SKIP
  >>> model(input=np.zeros((1, 3, 224, 224), np.float32))["output"].shape  # doctest: +SKIP
  (1, 1000)
  """
  def __init__(self, proto: onnx.ModelProto, device: str | None = None, base_dir: str | None = None):
    self.proto = proto
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    self.base_dir = base_dir
    self.opsets = {canonical_domain(o.domain): int(o.version) for o in proto.opset_import}
    if "" not in self.opsets and proto.ir_version < 3: self.opsets[""] = 1
    self.functions: dict[tuple[str, str], Graph] = {}
    for fn in proto.functions:  # model-local functions run as subgraphs (after the opsets they import are known)
      for o in fn.opset_import: self.opsets.setdefault(canonical_domain(o.domain), int(o.version))
      self.functions[(fn.domain, fn.name)] = Graph(onnx.GraphProto(), self, fn)
    self.graph = Graph(proto.graph, self)

  @property
  def inputs(self) -> list[ValueSpec]: return self.graph.inputs
  @property
  def outputs(self) -> list[ValueSpec]: return self.graph.outputs

  def __call__(self, **inputs: Any) -> dict[str, Any]:
    """Run the model. Each graph input is a numpy array, a Tensor, a Python number or list, a list of arrays (a
    sequence input) or None (an omitted optional input); returns every graph output by name, as lazy Tensors."""
    unknown = set(inputs) - {i.name for i in self.inputs}
    if unknown:
      raise OnnxError(f"the model has no inputs {sorted(unknown)}; its inputs are {[i.name for i in self.inputs]}")
    dims: dict[str, int] = {}
    feeds = {spec.name: self._input(spec, inputs, dims) for spec in self.inputs}
    return dict(zip((o.name for o in self.outputs), self.graph.run(feeds)))

  def _input(self, spec: ValueSpec, inputs: Mapping[str, Any], dims: dict[str, int]) -> Any:
    if spec.name not in inputs:
      if spec.kind == "optional": return None
      raise OnnxError(f"input {spec.name!r} is missing; the model's inputs are {[i.name for i in self.inputs]}")
    value = inputs[spec.name]
    if value is None:
      if spec.kind == "optional": return None
      raise OnnxError(f"input {spec.name!r} is None, but the model declares it a required {spec.kind}")
    if spec.kind == "sequence" or (spec.kind == "optional" and isinstance(value, list)):
      return [self._tensor(spec, v, dims, check_shape=False) for v in value]
    return self._tensor(spec, value, dims, check_shape=True)

  def _tensor(self, spec: ValueSpec, value: Any, dims: dict[str, int], check_shape: bool) -> Tensor:
    if isinstance(value, Tensor): t = value if value.device == self.device else value.to(self.device)
    else:
      arr = np.asarray(value)
      want = spec.dtype
      if arr.dtype.kind in "biuf" and (want is None or want.fmt is not None or arr.dtype.itemsize == 4):
        if want is not None and want.fmt is None: t = Tensor(arr.astype(np.float32), device=self.device).cast(want)
        else: t = Tensor(arr, device=self.device)
      elif arr.dtype.kind == "V" or str(arr.dtype) in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        if want is None: raise DTypeError(f"input {spec.name!r} of numpy dtype {arr.dtype} needs a declared dtype")
        t = Tensor(arr.astype(np.float32), device=self.device).cast(want)
      else:
        raise DTypeError(f"input {spec.name!r} has numpy dtype {arr.dtype}, which ember cannot hold; pass a numeric "
                         "or bool array")
    if spec.dtype is not None and t.dtype != spec.dtype:
      raise DTypeError(f"input {spec.name!r} is {t.dtype!r} but the model declares {spec.dtype!r}; convert it first "
                       f"(numpy: .astype)")
    if check_shape and spec.shape is not None:
      if len(spec.shape) != t.ndim:
        raise ShapeError(f"input {spec.name!r} has shape {t.shape}, the model declares rank {len(spec.shape)} "
                         f"{spec.shape}")
      for axis, (want_dim, got) in enumerate(zip(spec.shape, static_shape(t, "an ONNX input"))):
        if isinstance(want_dim, int) and want_dim > 0 and want_dim != got:
          raise ShapeError(f"input {spec.name!r} has shape {t.shape}, the model declares {spec.shape}: dim {axis} is "
                           f"{got}, not {want_dim}")
        if isinstance(want_dim, str) and dims.setdefault(want_dim, got) != got:
          raise ShapeError(f"input {spec.name!r} dim {axis} ({want_dim!r}) is {got}, but another input set "
                           f"{want_dim!r} to {dims[want_dim]}")
    return t

def load(path_or_bytes: str | os.PathLike[str] | bytes, device: str | None = None) -> OnnxModel:
  """Load an ONNX model from a path or its serialized bytes, its weights on `device` (default: Device.DEFAULT).

  >>> model = load("model.onnx")          # doctest: +SKIP
  >>> outputs = model(x=np.ones((1, 3)))  # doctest: +SKIP
  """
  if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
    what, base_dir = f"the {len(path_or_bytes)} bytes given", None
    parse: Callable[[], onnx.ModelProto] = lambda: onnx.load_from_string(bytes(path_or_bytes))  # noqa: E731
  else:
    path = os.fspath(path_or_bytes)
    if not os.path.isfile(path): raise OnnxError(f"no ONNX model at {path!r}")
    what, base_dir = repr(path), os.path.dirname(os.path.abspath(path))
    parse = lambda: onnx.load(path, load_external_data=False)  # noqa: E731
  try: proto = parse()
  except DecodeError as e:
    raise OnnxError(f"{what} are not a serialized ONNX model (protobuf: {e}); export it with torch.onnx.export or "
                    "onnx.save") from e
  return OnnxModel(proto, device, base_dir)

def load_proto(proto: onnx.ModelProto, device: str | None = None, base_dir: str | None = None) -> OnnxModel:
  """An OnnxModel from an already parsed ModelProto (the onnx.backend adapter's entry)."""
  return OnnxModel(proto, device, base_dir)
