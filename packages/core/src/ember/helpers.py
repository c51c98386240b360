"""Config flags (typed, env-backed `ContextVar`s and `Context`), small utilities, the `DEV` target parser, and the
public helpers tinygrad programs import: `from ember.helpers import getenv, Context, GlobalCounters, Timing, trange,
tqdm, colored, ...` works as `from tinygrad.helpers import ...` does (docs/tinygrad-compat.md lists them).

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
import shutil
import sqlite3
import sys
import time
import warnings
from dataclasses import dataclass
from typing import IO, Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

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
        from ember.errors import ContextKeyError
        raise ContextKeyError(f"unknown Context key {k!r}; known keys: {sorted(ContextVar._cache)}")
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
# QDOT=1: decode matvecs of kept-quantised weights (ember-nn) run on Ops.QDOT where the renderer has it (docs/llm.md)
QDOT = ContextVar("QDOT", 0)
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32")
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32")
SEED = ContextVar("SEED", 0)
# VIZ=1 serves the rewrite/kernel web UI at exit (VIZ_PORT, default 8000), VIZ=file.json saves the trace instead;
# TRACK_MATCH_STATS=1 prints per-rule match counts and times at exit (2: every rule tried). Read at `import ember`.
VIZ = ContextVar("VIZ", "")
VIZ_PORT = ContextVar("VIZ_PORT", -1)
TRACK_MATCH_STATS = ContextVar("TRACK_MATCH_STATS", 0)
CACHEDB = ContextVar("CACHEDB",
                     os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ember", "cache.db"))

# ** small utilities **

def prod(xs: Iterable[Any], start: Any = 1) -> Any: return functools.reduce(operator.mul, xs, start)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def argsort(xs: list[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def ceildiv(a: int, b: int) -> int: return -(-a // b)
_COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")
def colored(s: str, color: str | None, background: bool = False) -> str:
  """`s` in an ANSI color: one of black, red, green, yellow, blue, magenta, cyan, white; UPPER CASE is the bright
  variant, `background=True` colors the background."""
  if color is None: return s
  if color.lower() not in _COLORS:
    raise ValueError(f"unknown color {color!r}; use one of {_COLORS} (upper case: bright)")
  code = 30 + _COLORS.index(color.lower()) + 60 * (color.isupper()) + 10 * background
  return f"\u001b[{code}m{s}\u001b[0m"
def ansistrip(s: str) -> str: return re.sub("\x1b\\[(K|.*?m)", "", s)
def ansilen(s: str) -> int: return len(ansistrip(s))
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))  # keeps the first occurrence's order
def all_same(items: Sequence[Any]) -> bool: return all(x == items[0] for x in items)
def all_int(xs: Sequence[Any]) -> bool: return all(isinstance(x, int) for x in xs)
def argfix(*xs: Any) -> tuple[Any, ...]:
  """`f(1, 2)` and `f((1, 2))` / `f([1, 2])` as the same tuple."""
  if xs and isinstance(xs[0], (tuple, list)):
    if len(xs) != 1: raise ValueError(f"argfix: a sequence must be the only argument, got {xs}")
    return tuple(xs[0])
  return xs
def make_tuple(x: int | Sequence[int], cnt: int) -> tuple[int, ...]:
  return (x,) * cnt if isinstance(x, int) else tuple(x)
def fully_flatten(xs: Any) -> list[Any]:
  if not isinstance(xs, (list, tuple)): return [xs]
  return [y for x in xs for y in fully_flatten(x)]
def round_up(num: int, amt: int) -> int: return ceildiv(num, amt) * amt
def partition(xs: Iterable[T], fn: Callable[[T], bool]) -> tuple[list[T], list[T]]:
  """(the items where fn is true, the rest), each in order."""
  yes: list[T] = []
  no: list[T] = []
  for x in xs: (yes if fn(x) else no).append(x)
  return yes, no
def unwrap(x: T | None) -> T:
  if x is None: raise ValueError("unwrap: got None")
  return x

# ** counters, timing and progress **

class GlobalCounters:
  """What the realizes since the last `reset()` ran: kernels launched (TinyJit replays included), FLOPs and bytes
  the kernels move (estimates), and kernel time in seconds (measured when kernels are timed, at DEBUG>=2)."""
  kernel_count: int = 0
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0
  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0, 0
    GlobalCounters.time_sum_s = 0.0

class Timing(contextlib.ContextDecorator):
  """Time a block (or, as a decorator, each call) and write `<prefix><ms> ms<on_exit(ns)>` to `file` (stdout).

  >>> with Timing("step: "): pass  # doctest: +ELLIPSIS
  step: ... ms
  """
  def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True,
               file: IO[str] | None = None):
    self.prefix, self.on_exit, self.enabled, self.file = prefix, on_exit, enabled, file
  def __enter__(self) -> Timing:
    self.st = time.perf_counter_ns()
    return self
  def __exit__(self, *exc: Any) -> None:
    self.et = time.perf_counter_ns() - self.st
    if not self.enabled: return
    out = self.file if self.file is not None else sys.stdout
    out.write(f"{self.prefix}{self.et * 1e-6:6.2f} ms{self.on_exit(self.et) if self.on_exit else ''}\n")

class tqdm(Generic[T]):
  """A small progress bar (tinygrad's, with no dependency): wraps an iterable, or counts `update(n)` calls, and
  redraws `desc: 42%|####   | 42/100 [00:01<00:02, 35.00it/s]` on `file` (stderr). `disable=None` shows it only on
  a terminal. Redraws are throttled to about `rate` per second."""
  def __init__(self, iterable: Iterable[T] | None = None, desc: str = "", disable: bool | None = False,
               unit: str = "it", total: int | None = None, rate: int = 100, file: IO[str] | None = None):
    self.file = file if file is not None else sys.stderr
    self.disable = not self.file.isatty() if disable is None else disable
    self.iterable, self.unit, self.rate = iterable, unit, rate
    sized = hasattr(iterable, "__len__")
    self.total = total if total is not None else (len(iterable) if sized else 0)  # type: ignore[arg-type]
    self.st, self.n, self.calls, self.skip = time.perf_counter(), 0, 0, 1
    self.set_description(desc)
    self.update(0)
  def __iter__(self) -> Iterator[T]:
    if self.iterable is None: raise TypeError("tqdm: iterate over an iterable given at construction, or call update()")
    for item in self.iterable:
      yield item
      self.update(1)
    self.close()
  def __enter__(self) -> tqdm[T]: return self
  def __exit__(self, *exc: Any) -> None: self.close()
  def set_description(self, desc: str) -> None: self.desc = f"{desc}: " if desc else ""
  def close(self) -> None: self.update(0, close=True)
  def update(self, n: int = 0, close: bool = False) -> None:
    self.n, self.calls = self.n + n, self.calls + 1
    if self.disable or (not close and self.calls % self.skip != 0): return
    elapsed = time.perf_counter() - self.st
    if elapsed > 0 and self.calls / elapsed > self.rate: self.skip = max(int(self.calls / elapsed) // self.rate, 1)
    self.file.write(self._line(elapsed) + ("\n" if close else ""))
    self.file.flush()
  def _line(self, elapsed: float) -> str:
    speed = f"{self.n / elapsed:5.2f}" if self.n and elapsed > 0 else "?"
    if not self.total: return f"\r{self.desc}{self.n}{self.unit} [{_hms(elapsed)}, {speed}{self.unit}/s]"
    frac = min(self.n / self.total, 1.0)
    eta = _hms(elapsed / self.n * (self.total - self.n)) if self.n else "?"
    suffix = f"{self.n}/{self.total} [{_hms(elapsed)}<{eta}, {speed}{self.unit}/s]"
    width = max(shutil.get_terminal_size().columns - ansilen(self.desc) - len(suffix) - 8, 1)
    bar = ("#" * int(width * frac)).ljust(width)
    return f"\r{self.desc}{100 * frac:3.0f}%|{bar}| {suffix}"
  @classmethod
  def write(cls, s: str, file: IO[str] | None = None) -> None:
    """Write a line above the bar (clearing it first)."""
    (file if file is not None else sys.stderr).write(f"\r\u001b[K{s}\n")

def _hms(t: float) -> str:
  mins, secs = divmod(int(t), 60)
  return f"{mins:02d}:{secs:02d}" if mins < 60 else f"{mins // 60}:{mins % 60:02d}:{secs:02d}"

def trange(n: int, **kwargs: Any) -> tqdm[int]:
  """`tqdm(range(n))`."""
  return tqdm(range(n), total=n, **kwargs)

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
_DB_TIMEOUT = 30.0  # seconds a statement waits for another process's lock

def _setup(conn: sqlite3.Connection, sql: str) -> None:
  # sqlite answers SQLITE_BUSY at once, without waiting in its busy handler, when two connections open a new database
  # together and both ask for the WAL journal (the switch needs an exclusive lock and waiting could deadlock). Such a
  # failure left this process without a disk cache and silently dropped its writes, so retry with backoff instead.
  deadline, pause = time.monotonic() + _DB_TIMEOUT, 0.001
  while True:
    try:
      conn.execute(sql)
      return
    except sqlite3.OperationalError as e:
      if getattr(e, "sqlite_errorcode", None) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) \
         or time.monotonic() + pause > deadline: raise
    time.sleep(pause)
    pause = min(pause * 2, 0.1)

def _db() -> sqlite3.Connection | None:
  path = CACHEDB.value
  if path in _db_conn: return _db_conn[path]
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    conn = sqlite3.connect(path, timeout=_DB_TIMEOUT, isolation_level=None, check_same_thread=False)
    _setup(conn, "PRAGMA journal_mode=WAL")
    for legacy in _LEGACY_TABLES: _setup(conn, f"DROP TABLE IF EXISTS {legacy}")
    _setup(conn, f"CREATE TABLE IF NOT EXISTS {_CACHE_TABLE} "
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

