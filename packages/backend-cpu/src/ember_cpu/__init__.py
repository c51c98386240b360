"""ember-backend-cpu: the CPU device for ember (C through the system compiler, or LLVM IR through llvmlite)."""
__version__ = "0.1.0"
