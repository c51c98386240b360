"""helpers: Context scoping, the sqlite disk cache (also with two processes writing at once), Compiler caching."""
from __future__ import annotations
import subprocess
import sys
import textwrap
from pathlib import Path
import pytest
from ember.device.base import Compiler
from ember.helpers import DEBUG, Context, content_hash, diskcache_get, diskcache_put

@pytest.fixture
def cachedb(tmp_path: Path):
  with Context(CACHEDB=str(tmp_path / "cache.db")):
    yield tmp_path / "cache.db"

def test_context_restores_values_even_on_error():
  before = DEBUG.value
  with pytest.raises(ZeroDivisionError):
    with Context(DEBUG=3):
      assert DEBUG.value == 3
      _ = 1 / 0
  assert DEBUG.value == before

def test_context_rejects_unknown_keys():
  with pytest.raises(KeyError, match="NOT_A_FLAG"):
    Context(NOT_A_FLAG=1).__enter__()

def test_diskcache_round_trip(cachedb: Path):
  assert diskcache_get("t", "k") is None
  diskcache_put("t", "k", {"a": [1, 2, 3]})
  assert diskcache_get("t", "k") == {"a": [1, 2, 3]}
  assert diskcache_get("other_table", "k") is None
  with Context(CACHELEVEL=0):
    assert diskcache_get("t", "k") is None

def test_two_processes_write_the_cache_at_once(cachedb: Path):
  code = textwrap.dedent(f"""
    import sys
    from ember.helpers import Context, diskcache_put, diskcache_get
    with Context(CACHEDB={str(cachedb)!r}):
      for i in range(200):
        diskcache_put("race", f"{{sys.argv[1]}}-{{i}}", i)
      assert all(diskcache_get("race", f"{{sys.argv[1]}}-{{i}}") == i for i in range(200))
  """)
  src = str(Path(__file__).resolve().parents[1] / "src")
  env = {"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}
  procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env, stderr=subprocess.PIPE) for name in ("a", "b")]
  for p in procs:
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
  assert all(diskcache_get("race", f"{n}-{i}") == i for n in "ab" for i in range(200))

class CountingCompiler(Compiler):
  calls = 0
  def compile(self, src: str) -> bytes:
    CountingCompiler.calls += 1
    return src[::-1].encode()

def test_compile_cached_is_content_addressed(cachedb: Path):
  CountingCompiler.calls = 0
  first = CountingCompiler("counting").compile_cached("int main;")
  again = CountingCompiler("counting").compile_cached("int main;")
  other = CountingCompiler("counting").compile_cached("int other;")
  assert first == again == b";niam tni" and other == b";rehto tni"
  assert CountingCompiler.calls == 2
  assert content_hash("x") != content_hash("y")
