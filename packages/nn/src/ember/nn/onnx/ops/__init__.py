"""The ONNX op implementations, one module per family; importing this package fills `registry.OPS`."""
from ember.nn.onnx.ops import elementwise, reduce, movement, nn, quant, control, transformer, recurrent  # noqa: F401
