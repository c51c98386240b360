"""helpers: Context scoping, the sqlite disk cache (also with two processes writing at once, and with damaged,
tampered and foreign entries), Compiler caching."""
from __future__ import annotations
import os
import pickle
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
import pytest
from ember.device.base import Compiler
from ember import helpers
from ember.helpers import DEBUG, CacheWarning, Context, content_hash, diskcache_get, diskcache_put

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
  from ember.errors import ContextKeyError
  with pytest.raises(KeyError, match="NOT_A_FLAG") as e:
    Context(NOT_A_FLAG=1).__enter__()
  assert isinstance(e.value, ContextKeyError)

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

def test_opening_the_cache_waits_out_a_writer_that_sqlite_would_not_wait_for(cachedb: Path):
  # Another connection holds the write lock while this process opens the cache: sqlite answers the WAL switch with
  # SQLITE_BUSY at once (no busy handler, to avoid a deadlock), which used to leave the process without a cache and
  # drop its writes silently (the flaky two-process test). Opening must wait until the lock is released.
  import threading
  other = sqlite3.connect(cachedb, isolation_level=None, check_same_thread=False)
  other.execute("CREATE TABLE other (x)")
  other.execute("BEGIN IMMEDIATE")
  other.execute("INSERT INTO other VALUES (1)")
  release = threading.Timer(0.2, lambda: other.execute("COMMIT"))
  release.start()
  try:
    assert diskcache_put("t", "k", [1, 2]) == [1, 2]
  finally:
    release.join()
    other.close()
  assert helpers._db() is not None and diskcache_get("t", "k") == [1, 2]

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

# ** a damaged, tampered or foreign cache never runs code and never crashes: the entry is dropped and recomputed **

def _rows(path: Path) -> list[tuple[str, str, bytes]]:
  with sqlite3.connect(path) as conn:
    return conn.execute(f"SELECT table_name, key, value FROM {helpers._CACHE_TABLE}").fetchall()

def _set_value(path: Path, table: str, key: str, value: bytes) -> None:
  with sqlite3.connect(path) as conn:
    conn.execute(f"UPDATE {helpers._CACHE_TABLE} SET value=? WHERE table_name=? AND key=?", (value, table, key))

class RunsShell:
  """Unpickling this runs a shell command: what a tampered pickle cache would execute."""
  def __init__(self, marker: Path): self.marker = marker
  def __reduce__(self) -> tuple: return (os.system, (f"touch {self.marker}",))

def _compile_twice_with(cachedb: Path, damage) -> bytes:
  CountingCompiler.calls = 0
  compiler = CountingCompiler("counting")
  first = compiler.compile_cached("int damaged;")
  [(table, key, stored)] = [r for r in _rows(cachedb) if r[0] == "counting"]
  assert stored == first
  _set_value(cachedb, table, key, damage(stored))
  with pytest.warns(CacheWarning, match=f"counting/{key}.*checksum.*recomputed"):
    again = compiler.compile_cached("int damaged;")
  assert again == first and CountingCompiler.calls == 2  # recompiled, not loaded
  assert compiler.compile_cached("int damaged;") == first and CountingCompiler.calls == 2  # the good entry is back
  return first

@pytest.mark.parametrize("damage", [
  pytest.param(lambda b: b[:len(b) // 2], id="truncated"),
  pytest.param(lambda b: b[:3] + bytes([b[3] ^ 0x01]) + b[4:], id="one-bit-flipped"),
  pytest.param(lambda b: bytes(x ^ 0xFF for x in b), id="every-byte-flipped"),
  pytest.param(lambda b: b"", id="emptied"),
  pytest.param(lambda b: b + b"\x00", id="extended"),
])
def test_damaged_binary_is_recompiled_with_a_warning(cachedb: Path, damage) -> None:
  _compile_twice_with(cachedb, damage)

def test_tampered_pickle_is_never_executed(cachedb: Path, tmp_path: Path) -> None:
  marker = tmp_path / "pwned"
  evil = pickle.dumps(RunsShell(marker))
  _compile_twice_with(cachedb, lambda b: evil)
  diskcache_put("t", "k", {"a": 1})
  _set_value(cachedb, "t", "k", evil)
  with pytest.warns(CacheWarning): assert diskcache_get("t", "k") is None
  assert diskcache_get("t", "k") is None and all(r[:2] != ("t", "k") for r in _rows(cachedb))  # the row is gone
  # even a pickle stored with a valid checksum comes back as the bytes it is, never loaded
  diskcache_put("t", "raw", evil)
  assert diskcache_get("t", "raw") == evil
  assert not marker.exists()

def test_foreign_entry_under_another_key_is_dropped(cachedb: Path) -> None:
  diskcache_put("t", "a", b"binary of a")
  diskcache_put("t", "b", b"binary of b")
  table = helpers._CACHE_TABLE
  with sqlite3.connect(cachedb) as conn:  # copy a's whole row (checksum included) over b's
    row = conn.execute(f"SELECT kind, checksum, value FROM {table} WHERE key='a'").fetchone()
    conn.execute(f"UPDATE {table} SET kind=?, checksum=?, value=? WHERE key='b'", row)
  with pytest.warns(CacheWarning, match="t/b"): assert diskcache_get("t", "b") is None
  assert diskcache_get("t", "a") == b"binary of a"

def test_entry_of_another_format_or_kind_is_dropped(cachedb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  with monkeypatch.context() as m:
    m.setattr(helpers, "CACHE_FORMAT", helpers.CACHE_FORMAT + 1)  # a future ember wrote this row into our table
    diskcache_put("t", "k", [1, 2])
  with pytest.warns(CacheWarning, match="another cache format"): assert diskcache_get("t", "k") is None
  diskcache_put("t", "k", [1, 2])
  with sqlite3.connect(cachedb) as conn: conn.execute(f"UPDATE {helpers._CACHE_TABLE} SET kind='pickle'")
  with pytest.warns(CacheWarning): assert diskcache_get("t", "k") is None

def test_pickle_era_table_is_dropped_unread(tmp_path: Path) -> None:
  path = tmp_path / "old.db"
  marker = tmp_path / "pwned"
  with sqlite3.connect(path) as conn:
    conn.execute("CREATE TABLE cache (table_name TEXT, key TEXT, value BLOB, PRIMARY KEY (table_name, key))")
    conn.execute("INSERT INTO cache VALUES ('t', 'k', ?)", (pickle.dumps(RunsShell(marker)),))
  with Context(CACHEDB=str(path)):
    assert diskcache_get("t", "k") is None
  with sqlite3.connect(path) as conn:
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='cache'").fetchone() is None
  assert not marker.exists()

@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), {"opt": Compiler}])
def test_only_plain_data_is_stored(cachedb: Path, value) -> None:
  with pytest.raises(TypeError, match="stores bytes, str or plain JSON"): diskcache_put("t", "k", value)
  assert diskcache_get("t", "k") is None

def test_data_kinds_round_trip(cachedb: Path) -> None:
  for key, value in [("b", b"\x00\xff"), ("s", "\u00e9 text"), ("j", {"opts": [["THREADS", 0, 4]], "x": None})]:
    diskcache_put("t", key, value)
    assert diskcache_get("t", key) == value and type(diskcache_get("t", key)) is type(value)
  diskcache_put("t", "tuple", (1, "a"))
  assert diskcache_get("t", "tuple") == [1, "a"]  # JSON: a tuple comes back as a list
