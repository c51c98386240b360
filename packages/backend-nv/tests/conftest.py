"""Settings for the NV backend's tests: strict backend loading, the IR spec checker, `nv_kernels` importable."""
from __future__ import annotations
import os
import sys
os.environ.setdefault("EMBER_STRICT_BACKENDS", "1")
os.environ.setdefault("SPEC", "1")
os.environ.setdefault("EMBER_PLUGINS", "nv=ember_nv.plugin")  # from a source checkout the entry point is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402  after the environment defaults above, which must precede any ember import

def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "plain_install: installs ember-core and ember-backend-nv into a fresh venv "
                                     "(minutes); runs only with `-m plain_install` (nox -s tests-nv does)")

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  if "plain_install" in (config.option.markexpr or ""): return
  for item in items:
    if "plain_install" in item.keywords:
      item.add_marker(pytest.mark.skip(reason="fresh-venv install test: select it with `pytest -m plain_install`"))
