"""Process replay: the generated code of a fixed corpus, captured from two trees and compared (docs/replay.md).

  python -m ember.replay capture DIR [--only 'bench/*'] [--tree PATH]
  python -m ember.replay compare DIR_A DIR_B
  nox -s replay -- REF

The driver imports only itself relatively and ember through the APIs in `pipeline`, so a copy of it runs against an
older tree (`capture --tree`).
"""
from __future__ import annotations
from .record import capture, capture_tree
from .report import compare
from .corpus import WORKLOADS
from .errors import CaptureNotFoundError, ReplayError

__all__ = ["capture", "capture_tree", "compare", "WORKLOADS", "ReplayError", "CaptureNotFoundError"]
