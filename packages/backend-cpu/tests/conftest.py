from __future__ import annotations
import os
import sys
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for cpu_kernels (pytest runs in importlib mode)

import ember.plugin  # noqa: E402
from ember.renderer.cstyle import CStyleLanguage  # noqa: E402
from ember.renderer.llvmir import LLVMRenderer  # noqa: E402

# ember.plugin does not re-export the renderer bases yet: provide them until it does
for _name, _obj in (("CStyleLanguage", CStyleLanguage), ("LLVMRenderer", LLVMRenderer)):
  if not hasattr(ember.plugin, _name): setattr(ember.plugin, _name, _obj)
