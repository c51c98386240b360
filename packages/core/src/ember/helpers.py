"""Config flags (typed, env-backed `ContextVar`s and `Context`), small utilities and the `DEV` target parser.

Every flag reads its environment variable once at import; `Context(NAME=value)` overrides it in a scope.
"""
from __future__ import annotations
import contextlib
import functools
import hashlib
import math
import operator
import os
import re
import sqlite3
import pickle
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

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
def all_same(xs: list[Any]) -> bool: return all(x == xs[0] for x in xs)
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))
def ceildiv(a: int, b: int) -> int: return -(-a // b)
def round_up(a: int, b: int) -> int: return ceildiv(a, b) * b
def colored(s: str, color: str | None) -> str:
  codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}
  return s if color is None else f"\u001b[{codes[color]}m{s}\u001b[0m"
def to_tuple(x: Any) -> tuple[Any, ...]: return tuple(x) if isinstance(x, (list, tuple)) else (x,)
def is_pow2(x: int) -> bool: return x > 0 and (x & (x - 1)) == 0
def fmt_time(s: float) -> str: return f"{s*1e6:8.2f}us" if s < 1e-3 else f"{s*1e3:8.2f}ms"
def isfinite_num(x: float) -> bool: return not (math.isinf(x) or math.isnan(x))

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

_db_conn: dict[str, sqlite3.Connection] = {}

def _db() -> sqlite3.Connection | None:
  path = CACHEDB.value
  if path in _db_conn: return _db_conn[path]
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS cache "
                 "(table_name TEXT, key TEXT, value BLOB, PRIMARY KEY (table_name, key))")
  except (sqlite3.Error, OSError):
    return None  # an unwritable cache dir means no disk cache, not a failure
  _db_conn[path] = conn
  return conn

def diskcache_get(table: str, key: str) -> Any:
  if CACHELEVEL.value == 0 or (conn := _db()) is None: return None
  try: row = conn.execute("SELECT value FROM cache WHERE table_name=? AND key=?", (table, key)).fetchone()
  except sqlite3.Error: return None
  return pickle.loads(row[0]) if row is not None else None

def diskcache_put(table: str, key: str, value: Any) -> Any:
  if CACHELEVEL.value == 0 or (conn := _db()) is None: return value
  sql = "INSERT OR REPLACE INTO cache (table_name, key, value) VALUES (?, ?, ?)"
  try: conn.execute(sql, (table, key, pickle.dumps(value)))
  except sqlite3.Error: pass  # another process holding the lock past the timeout: the value is still returned
  return value

def content_hash(*parts: bytes | str) -> str:
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() if isinstance(p, str) else p)
  return h.hexdigest()

def temp_path(name: str) -> str: return os.path.join(tempfile.gettempdir(), name)

@contextlib.contextmanager
def cpu_time() -> Iterator[Callable[[], float]]:
  import time
  st = time.perf_counter()
  et: list[float] = []
  yield lambda: (et[0] if et else time.perf_counter()) - st
  et.append(time.perf_counter())
