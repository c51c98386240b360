"""The pytest plugin of the conformance kit (entry point ``pytest11: ember = ember.testing.plugin``).

Adds ``--ember-device=DEV`` (a ``DEV`` string: ``CPU``, ``CPU:LLVM``, ``NULL``...) and the fixtures ``ember_device``
(the canonical device name the kit tests open) and ``ember_capabilities`` (what that device declares). Installed with
ember-core, it is loaded by every pytest run, so it does nothing until the option is given or a kit test asks for a
fixture: no ember import happens before then.
"""
from __future__ import annotations
import os
from typing import Any
import pytest

def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("ember", "ember backend conformance kit")
  group.addoption("--ember-device", action="store", default=None, metavar="DEV",
                  help="device to run the ember conformance kit against, as a DEV string (CPU, CPU:LLVM, NULL...); "
                       "default: $DEV, else PYTHON")

def _target_string(config: pytest.Config) -> str:
  return config.getoption("--ember-device") or os.environ.get("DEV", "") or "PYTHON"

def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "ember_tier(name): the conformance-kit tier a test belongs to")
  if config.getoption("--ember-device") is None: return
  from ember.device import Device
  from ember.helpers import SPEC
  Device.DEFAULT = config.getoption("--ember-device")  # selects interface/renderer/arch exactly as DEV would
  SPEC.value = max(int(SPEC.value), 1)  # the IR spec checker is on for a conformance run

# The test oracles: a CI session that sets EMBER_REQUIRE_ORACLES=1 installs them, so a module skipped because one of
# them is missing means that session tests nothing it claims to (hardware skips are not affected).
ORACLES = ("torch", "numpy", "hypothesis", "safetensors", "gguf", "onnx", "onnxruntime", "openai")

def _missing_oracle(report: pytest.CollectReport | pytest.TestReport) -> str | None:
  if not report.skipped or not isinstance(report.longrepr, tuple): return None
  reason = str(report.longrepr[2])
  return next((name for name in ORACLES if f"could not import '{name}'" in reason), None)

def _fail_missing_oracle(report: pytest.CollectReport | pytest.TestReport) -> None:
  if os.environ.get("EMBER_REQUIRE_ORACLES", "") in ("", "0") or (name := _missing_oracle(report)) is None: return
  report.outcome = "failed"
  report.longrepr = (f"{report.nodeid}: skipped because the test oracle {name!r} is not installed, but "
                     f"EMBER_REQUIRE_ORACLES is set: install it in this session (noxfile.py) or unset the flag")

@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
  outcome = yield
  _fail_missing_oracle(outcome.get_result())

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
  outcome = yield
  _fail_missing_oracle(outcome.get_result())

def pytest_report_header(config: pytest.Config) -> str | None:
  if config.getoption("--ember-device") is None: return None
  return f"ember conformance kit: --ember-device={config.getoption('--ember-device')}"

@pytest.fixture(scope="session")
def ember_device(pytestconfig: pytest.Config) -> str:
  """The canonical name of the device under test (``"CPU"``, ``"NULL"``). A device that cannot be opened fails the
  test with the reason."""
  from ember.device import Device
  from ember.errors import DeviceError
  from ember.helpers import parse_target
  target = parse_target(_target_string(pytestconfig))
  if pytestconfig.getoption("--ember-device") is None: Device.DEFAULT = _target_string(pytestconfig)
  name = target.device_str
  try: Device[name]
  except DeviceError as e: pytest.fail(f"the device under test {name} does not open: {e}")
  return name

@pytest.fixture(scope="session")
def ember_capabilities(ember_device: str) -> Any:
  """`ember.testing.Capabilities` of the device under test."""
  from ember.testing import capabilities
  return capabilities(ember_device)
