"""TinyJit's HCQ graph on MOCK+AMD: one PM4 submission per replay, kernels in capture order, the timeline signal and
per-kernel timestamps written by the command stream; swapped inputs and bound Variables patched in place."""
from __future__ import annotations
import pytest
from ember.testing.hcq_graph import (check_bound_variables_patch_in_place, check_mlp_step_replays_as_one_submission,
                                    check_profiled_replay_is_one_submission)
from ember.testing.hostshim import selected_device

@pytest.fixture(scope="module")
def mock_amd():
  with selected_device("MOCK+AMD", "AMD") as dev: yield dev

def _launches(dev):
  dev.gpu.launches = []
  def take() -> list[int]:
    ran, dev.gpu.launches = dev.gpu.launches, []
    return ran
  return take

def test_mlp_step_replays_as_one_submission(mock_amd) -> None:
  check_mlp_step_replays_as_one_submission(mock_amd, "AMD", _launches(mock_amd), lambda prg: prg.code_addr)
  mock_amd.gpu.launches = None

def test_profiled_replay_is_one_submission(mock_amd) -> None:
  check_profiled_replay_is_one_submission(mock_amd, "AMD")

def test_bound_variables_are_patched_in_place(mock_amd) -> None:
  check_bound_variables_patch_in_place(mock_amd, "AMD")
