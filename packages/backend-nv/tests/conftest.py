"""Settings for the NV backend's tests: strict backend loading, the IR spec checker, `nv_kernels` importable."""
from __future__ import annotations
import os
import sys
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")
os.environ.setdefault("EMBER_PLUGINS", "nv=ember_nv.plugin")  # from a source checkout the entry point is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
