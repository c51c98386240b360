"""The importer's contracts on small hand-built graphs: typed errors (unsupported op, attribute, input dtype/shape,
device dtype), opset dispatch, external data read lazily from disk, control flow and com.microsoft fusions, each
against ONNX Runtime."""
from __future__ import annotations
import os
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from ember.errors import DTypeError, EmberError, ShapeError  # noqa: E402
from ember.nn.onnx import OnnxError, UnsupportedOpError, load  # noqa: E402
from ember.nn.onnx.registry import lookup  # noqa: E402

def model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()) -> bytes:
  graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
  m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
  m.ir_version = 8
  return m.SerializeToString()

def vi(name, dtype=TensorProto.FLOAT, shape=(2, 3)): return helper.make_tensor_value_info(name, dtype, shape)

def test_unsupported_op_names_op_opset_and_node():
  m = model([helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")], [vi("x")], [vi("y")], opset=13)
  with pytest.raises(UnsupportedOpError, match=r"node 'mystery' \(NoSuchOp, ai.onnx opset 13\)") as e: load(m)
  assert isinstance(e.value, NotImplementedError) and isinstance(e.value, EmberError)

def test_op_newer_than_the_model_opset_is_unsupported():
  # Gelu exists from opset 20: a model importing opset 17 may not use it
  m = model([helper.make_node("Gelu", ["x"], ["y"], name="g")], [vi("x")], [vi("y")], opset=17)
  with pytest.raises(UnsupportedOpError, match="opset 17.*from opset 20"): load(m)

def test_unsupported_attribute_is_a_typed_error():
  m = model([helper.make_node("Relu", ["x"], ["y"], name="r", bogus=3)], [vi("x")], [vi("y")])
  with pytest.raises(UnsupportedOpError, match=r"node 'r' \(Relu.*attribute 'bogus'"):
    load(m)(x=np.zeros((2, 3), np.float32))

def test_opset_selects_the_version():
  assert lookup("", "Softmax", 11) is not lookup("", "Softmax", 13)
  assert lookup("", "Softmax", 12) is lookup("", "Softmax", 1)
  # opset 11 Softmax flattens to 2-D at axis=1; opset 13 normalizes over the last axis only
  x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
  for opset, want in ((11, np.exp(x) / np.exp(x).reshape(2, -1).sum(1).reshape(2, 1, 1)),
                      (13, np.exp(x) / np.exp(x).sum(-1, keepdims=True))):
    m = model([helper.make_node("Softmax", ["x"], ["y"])], [vi("x", shape=(2, 3, 4))], [vi("y", shape=(2, 3, 4))],
              opset=opset)
    np.testing.assert_allclose(load(m)(x=x)["y"].numpy(), want, rtol=1e-5)

def test_input_errors():
  m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")])
  net = load(m)
  with pytest.raises(OnnxError, match="input 'x' is missing"): net()
  with pytest.raises(DTypeError, match="'x' is dtypes.float64 but the model declares dtypes.float"):
    net(x=np.zeros((2, 3), np.float64))
  with pytest.raises(ShapeError, match="dim 1 is 4, not 3"): net(x=np.zeros((2, 4), np.float32))
  with pytest.raises(OnnxError, match="no inputs"): net(x=np.zeros((2, 3), np.float32), z=1)

def test_a_dtype_the_device_cannot_hold(monkeypatch):
  from ember import Device, dtypes
  renderer = Device[Device.DEFAULT].renderer
  monkeypatch.setattr(type(renderer), "unsupported_dtypes", frozenset({dtypes.float64}))
  init = numpy_helper.from_array(np.ones(3, np.float64), "w")
  m = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", TensorProto.DOUBLE, (3,))],
            [vi("y", TensorProto.DOUBLE, (3,))], [init])
  with pytest.raises(DTypeError, match="'w' is dtypes.float64, which device .* cannot hold"): load(m)

def test_external_data_is_read_from_disk(tmp_path):
  w = np.arange(12, dtype=np.float32).reshape(3, 4)
  init = numpy_helper.from_array(w, "w")
  proto = onnx.load_from_string(model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", shape=(2, 3))],
                                      [vi("y", shape=(2, 4))], [init]))
  path = str(tmp_path / "m.onnx")
  onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                  size_threshold=0)
  assert os.path.getsize(tmp_path / "w.bin") >= w.nbytes
  net = load(path)
  assert net.graph.initializers["w"].uop.src  # lazy: a copy from the DISK buffer, not data in memory
  x = np.ones((2, 3), np.float32)
  np.testing.assert_allclose(net(x=x)["y"].numpy(), x @ w)
  with pytest.raises(OnnxError, match="load the model from its path"): load(open(path, "rb").read())

def test_if_loop_and_scan_match_onnxruntime(ort_run):
  # If on a runtime condition, a Loop carrying a sum for M iterations with a scan output, a Scan computing a cumsum
  then_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"])], "then", [], [vi("t")])
  else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
  body = helper.make_graph(
    [helper.make_node("Add", ["acc", "x"], ["acc_out"]), helper.make_node("Identity", ["c"], ["c_out"]),
     helper.make_node("Identity", ["acc_out"], ["scan_out"])], "body",
    [helper.make_tensor_value_info("i", TensorProto.INT64, ()),
     helper.make_tensor_value_info("c", TensorProto.BOOL, ()), vi("acc")],
    [helper.make_tensor_value_info("c_out", TensorProto.BOOL, ()), vi("acc_out"), vi("scan_out")])
  scan_body = helper.make_graph(
    [helper.make_node("Add", ["s", "row"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])], "scan",
    [vi("s", shape=(3,)), vi("row", shape=(3,))], [vi("s2", shape=(3,)), vi("o", shape=(3,))])
  nodes = [helper.make_node("If", ["cond"], ["ify"], then_branch=then_g, else_branch=else_g),
           helper.make_node("Loop", ["m", "", "x"], ["loop_acc", "loop_scan"], body=body),
           helper.make_node("Scan", ["s0", "x"], ["scan_final", "scan_rows"], body=scan_body, num_scan_inputs=1)]
  inputs = [vi("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, ()),
            helper.make_tensor_value_info("m", TensorProto.INT64, ()), vi("s0", shape=(3,))]
  outputs = [vi("ify"), vi("loop_acc"), helper.make_tensor_value_info("loop_scan", TensorProto.FLOAT, None),
             vi("scan_final", shape=(3,)), vi("scan_rows")]
  m = model(nodes, inputs, outputs, opset=16)
  x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
  for cond in (True, False):
    feeds = {"x": x, "cond": np.array(cond), "m": np.array(3, np.int64), "s0": np.ones(3, np.float32)}
    want, got = ort_run(m, feeds), load(m)(**feeds)
    for k, v in want.items(): np.testing.assert_allclose(got[k].numpy(), v, rtol=1e-5, atol=1e-6, err_msg=k)

def test_microsoft_fusions_match_onnxruntime(ort_run):
  ms = helper.make_opsetid("com.microsoft", 1)
  rng = np.random.default_rng(4)
  x, skip = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(2))
  gamma, beta, bias = (rng.standard_normal(8).astype(np.float32) for _ in range(3))
  nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["sln", "", "", "sum"],
                            domain="com.microsoft", epsilon=1e-5),
           helper.make_node("FastGelu", ["x", "bias"], ["fg"], domain="com.microsoft"),
           helper.make_node("BiasGelu", ["x", "bias"], ["bg"], domain="com.microsoft"),
           helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
           helper.make_node("QuickGelu", ["x"], ["qg"], domain="com.microsoft", alpha=1.5)]
  inits = [numpy_helper.from_array(a, n) for a, n in ((gamma, "gamma"), (beta, "beta"), (bias, "bias"))]
  shape = (2, 5, 8)
  m = model(nodes, [vi("x", shape=shape), vi("skip", shape=shape)],
            [vi(n, shape=shape) for n in ("sln", "sum", "fg", "bg", "g", "qg")], inits, extra_opsets=[ms])
  want, got = ort_run(m, {"x": x, "skip": skip}), load(m)(x=x, skip=skip)
  for k, v in want.items(): np.testing.assert_allclose(got[k].numpy(), v, rtol=1e-4, atol=1e-5, err_msg=k)

def test_quantize_dequantize_match_onnxruntime(ort_run):
  rng = np.random.default_rng(5)
  x = (rng.standard_normal((4, 6)) * 3).astype(np.float32)
  scale = np.array([0.05, 0.1, 0.02, 0.2], np.float32)
  zp = np.array([3, -2, 0, 7], np.int8)
  nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], axis=0),
           helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["dq"], axis=0),
           helper.make_node("DynamicQuantizeLinear", ["x"], ["dy", "ds", "dz"])]
  inits = [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(zp, "zp")]
  outs = [vi("q", TensorProto.INT8, (4, 6)), vi("dq", shape=(4, 6)), vi("dy", TensorProto.UINT8, (4, 6)),
          vi("ds", shape=()), vi("dz", TensorProto.UINT8, ())]
  m = model(nodes, [vi("x", shape=(4, 6))], outs, inits, opset=13)
  want, got = ort_run(m, {"x": x}), load(m)(x=x)
  for k, v in want.items():
    assert got[k].numpy().dtype == v.dtype, k
    np.testing.assert_allclose(got[k].numpy(), v, rtol=1e-6, atol=1e-6, err_msg=k)

def test_command_line_prints_outputs(tmp_path, capsys):
  from ember.nn.onnx.__main__ import main
  m = model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)],
            [vi("x")], [vi("y"), vi("s", shape=())], opset=11)
  path = tmp_path / "m.onnx"
  path.write_bytes(m)
  x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
  np.save(tmp_path / "x.npy", x)
  assert main([str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 0
  out = capsys.readouterr().out
  assert "y: shape (2, 3) dtypes.float" in out and "s: shape () dtypes.float" in out
  with pytest.raises(OnnxError, match="NAME=FILE.npy"): main([str(path), "--input", "x.npy"])

def _loop_model(scan_shape):
  body = helper.make_graph(
    [helper.make_node("Add", ["acc", "x"], ["acc_out"]), helper.make_node("Identity", ["c"], ["c_out"]),
     helper.make_node("Cast", ["acc_out"], ["scan_out"], to=TensorProto.DOUBLE)], "body",
    [helper.make_tensor_value_info("i", TensorProto.INT64, ()),
     helper.make_tensor_value_info("c", TensorProto.BOOL, ()), vi("acc")],
    [helper.make_tensor_value_info("c_out", TensorProto.BOOL, ()), vi("acc_out"),
     helper.make_tensor_value_info("scan_out", TensorProto.DOUBLE, scan_shape)])
  return model([helper.make_node("Loop", ["m", "", "x"], ["loop_acc", "loop_scan"], body=body)],
               [vi("x"), helper.make_tensor_value_info("m", TensorProto.INT64, ())],
               [vi("loop_acc"), helper.make_tensor_value_info("loop_scan", TensorProto.DOUBLE, None)], opset=16)

@pytest.mark.parametrize("scan_shape", [(2, 3), None, ("n", None)])
@pytest.mark.parametrize("trips", [0, 2])
def test_loop_scan_outputs_of_zero_iterations_match_onnxruntime(ort_run, scan_shape, trips):
  # zero iterations: the scan output is (0, *the body's output shape) whether or not the body declares that shape
  m = _loop_model(scan_shape)
  feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array(trips, np.int64)}
  want, got = ort_run(m, feeds), load(m)(**feeds)
  for k, v in want.items():
    assert got[k].shape == v.shape and got[k].numpy().dtype == v.dtype, k
    np.testing.assert_allclose(got[k].numpy(), v, err_msg=k)

def test_scan_over_zero_steps_keeps_the_state_and_gives_empty_outputs():
  # (ONNX Runtime rejects a zero-length Scan input; the spec's answer: the initial state, outputs empty on the axis)
  body = helper.make_graph(
    [helper.make_node("Add", ["s", "row"], ["s2"]), helper.make_node("Mul", ["s2", "row"], ["o"])], "scan",
    [vi("s", shape=(3,)), vi("row", shape=(3,))], [vi("s2", shape=(3,)), vi("o", shape=(3,))])
  m = model([helper.make_node("Scan", ["s0", "xs"], ["final", "rows"], body=body, num_scan_inputs=1,
                              scan_output_axes=[1])],
            [vi("s0", shape=(3,)), vi("xs", shape=(None, 3))], [vi("final", shape=(3,)), vi("rows", shape=None)])
  s0 = np.array([1, 2, 3], np.float32)
  got = load(m)(s0=s0, xs=np.zeros((0, 3), np.float32))
  np.testing.assert_array_equal(got["final"].numpy(), s0)
  assert got["rows"].shape == (3, 0) and got["rows"].numpy().dtype == np.float32

def test_bytes_or_a_file_that_is_not_onnx_is_an_onnx_error(tmp_path):
  bad = tmp_path / "bad.onnx"
  bad.write_bytes(b"not an onnx model at all")
  for source in (b"not an onnx model", str(bad)):
    with pytest.raises(OnnxError, match="not a serialized ONNX model"): load(source)
