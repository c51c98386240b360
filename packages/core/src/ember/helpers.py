"""Config flags (typed, env-backed `ContextVar`s and `Context`), small utilities and the `DEV` target parser.

Every flag reads its environment variable once at import; `Context(NAME=value)` overrides it in a scope.
"""
from __future__ import annotations
import contextlib
import functools
import hashlib
import json
import operator
import os
import re
import sqlite3
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, TypeVar

T = TypeVar("T")

@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of `default`."""
  return type(default)(os.getenv(key, default))

class ContextVar:
  """A named, env-backed setting. `ContextVar("DEBUG", 0).value`; scoped overrides come from `Context`."""
  _cache: dict[str, ContextVar] = {}
  value: Any
  def __init__(self, key: str, default: Any):
    if key in ContextVar._cache: raise RuntimeError(f"ContextVar {key} already exists")
    self.key, self.default = key, default
    env = os.getenv(key)
    self.value = default if env is None else type(default)(env)
    ContextVar._cache[key] = self
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __repr__(self) -> str: return f"ContextVar({self.key}={self.value!r})"

class Context(contextlib.ContextDecorator):
  """Scoped settings: `with Context(DEBUG=2, DEFAULT_FLOAT=dtypes.half): ...`. Every env flag is a key."""
  def __init__(self, **kwargs: Any):
    self.kwargs = kwargs
  def __enter__(self) -> Context:
    self.old: dict[str, Any] = {}
    for k, v in self.kwargs.items():
      if k not in ContextVar._cache:
        raise KeyError(f"unknown Context key {k!r}; known keys: {sorted(ContextVar._cache)}")
      var = ContextVar._cache[k]
      self.old[k] = var.value
      if k in ("DEFAULT_FLOAT", "DEFAULT_INT"): v = _check_default_dtype(k, v)
      var.value = v
    return self
  def __exit__(self, *exc: Any) -> None:
    for k, v in self.old.items(): ContextVar._cache[k].value = v

def _check_default_dtype(key: str, v: Any) -> str:
  from ember.dtype import to_dtype, dtypes
  from ember.errors import DTypeError
  dt = to_dtype(v)
  ok = dtypes.is_float(dt) if key == "DEFAULT_FLOAT" else dtypes.is_int(dt) and not dtypes.is_unsigned(dt)
  kind = "float" if key == "DEFAULT_FLOAT" else "signed int"
  if not ok or dt.weak: raise DTypeError(f"{key} must be a {kind} dtype, got {dt!r}")
  return dt.name

# ** the flags **
DEBUG = ContextVar("DEBUG", 0)
SPEC = ContextVar("SPEC", 0)
NOOPT = ContextVar("NOOPT", 0)
BEAM = ContextVar("BEAM", 0)
JIT = ContextVar("JIT", 1)
TRAINING = ContextVar("TRAINING", 0)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
LRU = ContextVar("LRU", 1)
NUM_CPU_THREADS = ContextVar("NUM_CPU_THREADS", 0)
TRANSCENDENTAL = ContextVar("TRANSCENDENTAL", 1)
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32")
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32")
SEED = ContextVar("SEED", 0)
CACHEDB = ContextVar("CACHEDB",
                     os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ember", "cache.db"))

# ** small utilities **

def prod(xs: Iterable[Any], start: Any = 1) -> Any: return functools.reduce(operator.mul, xs, start)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def argsort(xs: list[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def ceildiv(a: int, b: int) -> int: return -(-a // b)
def colored(s: str, color: str | None) -> str:
  codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}
  return s if color is None else f"\u001b[{codes[color]}m{s}\u001b[0m"

# ** DEV target parsing **

@dataclass(frozen=True)
class Target:
  """A parsed `DEV` string: `[IFACE+]DEVICE[:RENDERER[:ARCH]]`, with `:N` device indices (`CPU:1`)."""
  device: str
  interface: str = ""
  renderer: str = ""
  arch: str = ""
  index: int = 0
  @property
  def device_str(self) -> str: return self.device if self.index == 0 else f"{self.device}:{self.index}"

_dev_re = re.compile(r"^(?:(?P<iface>[A-Za-z0-9_]+)\+)?(?P<dev>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>(?::[^:]*)*)$")

def parse_target(s: str) -> Target:
  """Parse `[IFACE+]DEVICE[:RENDERER[:ARCH]]`. A numeric first field is a device index: `CPU:1`, `CPU:1:LLVM`."""
  from ember.errors import DeviceError
  m = _dev_re.match(s.strip())
  if m is None or s.strip() == "":
    raise DeviceError(f"cannot parse device string {s!r}; expected [IFACE+]DEVICE[:RENDERER[:ARCH]], "
                      "e.g. CPU, CPU:LLVM, MOCK+NV:PTX:sm_90")
  fields = m.group("rest").split(":")[1:]
  index = 0
  if fields and fields[0].isdigit():
    index = int(fields.pop(0))
  if len(fields) > 2:
    raise DeviceError(f"too many ':' fields in device string {s!r}; expected [IFACE+]DEVICE[:N][:RENDERER[:ARCH]]")
  renderer = fields[0].upper() if fields else ""
  arch = fields[1] if len(fields) > 1 else ""
  return Target(m.group("dev").upper(), (m.group("iface") or "").upper(), renderer, arch, index)

# ** disk cache: content-addressed, sqlite, safe across processes **
# It stores data only: bytes (compiled binaries), str, or plain JSON, each beside a sha256 of its format version, table,
# key, kind and payload. Nothing read back is ever unpickled, and nothing is handed out (a binary to dlopen, say) unless
# that checksum matches: a tampered, truncated or bit-flipped entry, or one of another format, is dropped with a
# `CacheWarning` and recomputed.

CACHE_FORMAT = 2  # bump when the row layout or a kind's encoding changes: older rows then fail their checksum
_CACHE_TABLE = f"cache_v{CACHE_FORMAT}"
_LEGACY_TABLES = ("cache",)  # format 1 pickled its values: never read, dropped so nothing can load them again

class CacheWarning(UserWarning):
  """A disk-cache entry was damaged, foreign or of another format; it was dropped and its value is recomputed."""

_db_conn: dict[str, sqlite3.Connection] = {}

def _db() -> sqlite3.Connection | None:
  path = CACHEDB.value
  if path in _db_conn: return _db_conn[path]
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    for legacy in _LEGACY_TABLES: conn.execute(f"DROP TABLE IF EXISTS {legacy}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_CACHE_TABLE} "
                 "(table_name TEXT, key TEXT, kind TEXT, checksum TEXT, value BLOB, PRIMARY KEY (table_name, key))")
  except (sqlite3.Error, OSError):
    return None  # an unwritable cache dir means no disk cache, not a failure
  _db_conn[path] = conn
  return conn

def _cache_checksum(table: str, key: str, kind: str, payload: bytes) -> str:
  return content_hash(f"ember-cache-v{CACHE_FORMAT}\0{table}\0{key}\0{kind}\0", payload)

def _encode(table: str, key: str, value: Any) -> tuple[str, bytes]:
  if isinstance(value, bytes): return "bytes", value
  if isinstance(value, str): return "str", value.encode()
  try: return "json", json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
  except (TypeError, ValueError) as e:
    raise TypeError(f"diskcache_put({table!r}, {key!r}): the disk cache stores bytes, str or plain JSON data, not "
                    f"{type(value).__name__} ({e}); serialise it to one of those first") from e

def _decode(kind: str, payload: bytes) -> Any:
  if kind == "bytes": return payload
  if kind == "str": return payload.decode()
  if kind == "json": return json.loads(payload)
  raise ValueError(f"unknown kind {kind!r}")

def _drop(conn: sqlite3.Connection, table: str, key: str, checksum: Any, why: str) -> None:
  warnings.warn(f"ember disk cache {CACHEDB.value}: entry {table}/{key} {why}; dropped it, the value is recomputed",
                CacheWarning, stacklevel=4)
  sql = f"DELETE FROM {_CACHE_TABLE} WHERE table_name=? AND key=? AND checksum IS ?"  # not a good row written since
  try: conn.execute(sql, (table, key, checksum))
  except sqlite3.Error: pass  # another process holds the lock past the timeout: the next reader drops it

def diskcache_get(table: str, key: str) -> Any:
  """The value stored under `(table, key)`, or None when there is none or its entry is damaged (then dropped with a
  `CacheWarning`). JSON values come back as JSON types: a tuple stored is a list read."""
  if CACHELEVEL.value == 0 or (conn := _db()) is None: return None
  sql = f"SELECT kind, checksum, value FROM {_CACHE_TABLE} WHERE table_name=? AND key=?"
  try: row = conn.execute(sql, (table, key)).fetchone()
  except sqlite3.Error: return None
  if row is None: return None
  kind, checksum, payload = row
  if not isinstance(kind, str) or not isinstance(payload, bytes) or not isinstance(checksum, str):
    _drop(conn, table, key, checksum, "is not in the cache's format")
    return None
  if _cache_checksum(table, key, kind, payload) != checksum:
    _drop(conn, table, key, checksum, "does not match its checksum (damaged, foreign or of another cache format)")
    return None
  try: return _decode(kind, payload)
  except (ValueError, RecursionError) as e:  # only a forged checksum gets here
    _drop(conn, table, key, checksum, f"cannot be decoded ({type(e).__name__}: {e})")
    return None

def diskcache_put(table: str, key: str, value: Any) -> Any:
  """Store `value` (bytes, str or plain JSON data; `TypeError` for anything else) and return it."""
  kind, payload = _encode(table, key, value)
  if CACHELEVEL.value == 0 or (conn := _db()) is None: return value
  sql = f"INSERT OR REPLACE INTO {_CACHE_TABLE} (table_name, key, kind, checksum, value) VALUES (?, ?, ?, ?, ?)"
  try: conn.execute(sql, (table, key, kind, _cache_checksum(table, key, kind, payload), payload))
  except sqlite3.Error: pass  # another process holding the lock past the timeout: the value is still returned
  return value

def content_hash(*parts: bytes | str) -> str:
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() if isinstance(p, str) else p)
  return h.hexdigest()

