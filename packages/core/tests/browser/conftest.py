"""Browser tests of ember-core's pages (VIZ): selected with `pytest -m browser` (the `viz` nox session)."""
from __future__ import annotations
import pytest

def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "browser: drives a page in headless chromium; runs only with `-m browser`")
