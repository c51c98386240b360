"""Settings for the AMD backend's tests: strict backend loading, the IR spec checker, `amd_kernels` importable."""
from __future__ import annotations
import os
import sys
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")
# from a source checkout the entry point is not installed
os.environ.setdefault("EMBER_PLUGINS", "amd=ember_amd.plugin")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
