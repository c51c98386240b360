"""The error process replay raises for bad arguments: a folder that is no capture, an unknown workload, a path that
is no ember checkout."""
from __future__ import annotations
from ember.errors import EmberError

class ReplayError(EmberError, ValueError):
  """A replay command got an argument it cannot use; the message names it and the fix."""

class CaptureNotFoundError(ReplayError, FileNotFoundError):
  """A folder given to compare holds no capture (no manifest.json)."""
