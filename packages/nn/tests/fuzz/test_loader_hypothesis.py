"""Coverage-free runs of the weight-file readers with hypothesis (a short, derandomized one in the `fuzz` session; a
long one with EMBER_FUZZ_LONG=N examples): hypothesis picks the seed file,
the edits (byte overwrites, insertions, deletions, truncation) and shrinks a failing file to a small reproduction.
Each example is judged as in the `fuzz` session (loader_fuzz.run_case: typed error, or a load the reference agrees
with), in this process, under the same SIGALRM bound.

  EMBER_FUZZ_LONG=20000 python -m pytest -m fuzz packages/nn/tests/fuzz/test_loader_hypothesis.py -q

Without EMBER_FUZZ_LONG each format runs 25 derandomized examples. hypothesis keeps failing examples in .hypothesis/ and
replays them first.
Run the file alone (as above): its cases then run on DEV=PYTHON like the session's workers.
"""
from __future__ import annotations
import os
import sys
import tempfile
from pathlib import Path
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import loader_fuzz  # noqa: E402

EXAMPLES = int(os.environ.get("EMBER_FUZZ_LONG", "0"))
LONG = EXAMPLES > 0
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

@pytest.fixture(scope="module")
def seeds() -> dict[str, list[bytes]]:
  return {"safetensors": loader_fuzz.safetensors_seeds(), "pth": loader_fuzz.pth_seeds(),
          "gguf": [loader_fuzz.gguf_own_seed().data, loader_fuzz.gguf_reference_seed()]}

edit = st.tuples(st.sampled_from(["set", "insert", "delete", "truncate"]), st.integers(0, 2**16),
                 st.binary(min_size=1, max_size=8))

@pytest.mark.fuzz
@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "pth"])
def test_loader_hypothesis(fmt: str, seeds: dict[str, list[bytes]]):
  loader_fuzz.init_worker()  # DEV=PYTHON only takes effect when ember was not imported yet: run this file alone

  @hypothesis.settings(max_examples=EXAMPLES if LONG else 25, deadline=None, derandomize=not LONG)
  @hypothesis.given(st.integers(0, len(seeds[fmt]) - 1), st.lists(edit, min_size=1, max_size=4))
  def check(which: int, edits: list[tuple[str, int, bytes]]) -> None:
    data = bytearray(seeds[fmt][which])
    for kind, at, blob in edits:
      at %= len(data) + 1
      if kind == "set": data[at:at + len(blob)] = blob
      elif kind == "insert": data[at:at] = blob
      elif kind == "delete": del data[at:at + len(blob)]
      else: del data[at:]
    with tempfile.TemporaryDirectory() as tmp:
      kind, detail = loader_fuzz.run_case(loader_fuzz.Case(fmt, "hypothesis", bytes(data)), tmp)
    assert kind in ("typed", "load"), f"{kind}: {detail}"
  check()
