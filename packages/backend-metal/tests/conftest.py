"""Settings for the Metal backend's tests: strict backend loading, the IR spec checker, and the sibling helper
`msl_shim` importable (pytest runs in importlib mode, so a test module cannot import it by name otherwise)."""
from __future__ import annotations
import os
import sys
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
