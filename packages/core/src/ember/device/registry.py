"""Backend discovery, the device/renderer/compiler tables, DEV selection and the `Device` singleton.

Discovery is two-phase. Importing this module costs nothing: no entry point is read. The first use of `Device` reads
the ``ember.backends`` entry-point metadata, imports the enabled plugin modules (wiring only, by contract) and calls
their registration hooks; device classes are imported by the factories when a device is opened. The protocol a
backend implements is documented in `ember.plugin`.
"""
from __future__ import annotations
import atexit
import faulthandler
import importlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable
from ember.device.base import Compiled
from ember.device.registration import (PLUGIN_API_VERSION, PROJECT_NAME, BackendInfo, CompilerRegistry, DeviceRegistry,
                                         PluginWarning, ProbeResult, QueueRegistry, RendererRegistry)
from ember.errors import DeviceError, EmberError, PluginError
from ember.helpers import Target, getenv, parse_target

if TYPE_CHECKING:
  import pluggy
  from ember.device.base import Compiler
  from ember.device.registration import CompilerEntry, DeviceEntry, QueueEntry, RendererEntry
  from ember.renderer import Renderer

ENTRY_POINT_GROUP = "ember.backends"
BUILTIN_BACKEND = "core"
PROBE_TIMEOUT_S = 120.0  # a probe that has not answered by then counts as hung
# the probe process's time to load the backends and start the first probe, counted apart from the probe's own (a fresh
# interpreter on a loaded 2-core machine took over a second, which a short PROBE_TIMEOUT_S misread as a hung probe)
PROBE_START_TIMEOUT_S = 120.0

# ** where backends come from **

@dataclass(frozen=True)
class BackendSource:
  """A backend before it is imported: its name, the object path of its plugin (``module`` or ``module:attr``) and the
  distribution that ships it. Core's builtin plugin is one of these too, without an entry point."""
  name: str
  value: str
  distribution: str
  version: str
  builtin: bool = False
  def load(self) -> Any:
    module_name, _, attr = self.value.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")): obj = getattr(obj, part)
    return obj

def builtin_source() -> BackendSource:
  from ember import __version__
  return BackendSource(BUILTIN_BACKEND, "ember.device.builtin", "ember-core", __version__, builtin=True)

def entry_point_sources() -> list[BackendSource]:
  """The backends installed in this environment, from entry-point metadata only (nothing is imported)."""
  from importlib.metadata import entry_points
  sources = []
  for ep in entry_points(group=ENTRY_POINT_GROUP):
    dist = ep.dist
    dist_name = dist.name if dist is not None else "<unknown distribution>"
    dist_version = dist.version if dist is not None else "?"
    sources.append(BackendSource(ep.name.strip().lower(), ep.value, dist_name, dist_version))
  return sorted(sources, key=lambda s: (s.name, s.distribution))  # sys.path listing order is not stable

def env_plugin_sources(value: str) -> list[BackendSource]:
  """Backends named in ``EMBER_PLUGINS=name=module[,name=module]``, loaded without an installed distribution (for
  running from a source checkout, e.g. ``EMBER_PLUGINS=cpu=ember_cpu.plugin``). One replaces an installed entry point
  of the same name."""
  sources = []
  for item in filter(None, (p.strip() for p in value.split(","))):
    name, sep, module = item.partition("=")
    if not sep or not name.strip() or not module.strip():
      raise PluginError(f"cannot parse EMBER_PLUGINS item {item!r}; expected name=module, e.g. cpu=ember_cpu.plugin")
    sources.append(BackendSource(name.strip().lower(), module.strip(), "EMBER_PLUGINS", "source"))
  return sources

# ** core version checks (a small subset of PEP 440: enough for requires_core, no 'packaging' dependency) **

_release_re = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_clause_re = re.compile(r"^\s*(>=|<=|==|!=|~=|>|<)\s*(\d+(?:\.\d+)*)\s*$")

def release_tuple(version: str) -> tuple[int, ...]:
  """The numeric release part of a version: ``"0.1.0.dev3"`` -> ``(0, 1, 0)``."""
  m = _release_re.match(version)
  if m is None: raise PluginError(f"cannot read version {version!r}; expected a dotted number such as 0.1.0")
  return tuple(int(x) for x in m.group(1).split("."))

def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
  width = max(len(a), len(b))
  pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
  return (pa > pb) - (pa < pb)

def version_satisfies(version: str, spec: str) -> bool:
  """Whether ``version`` meets ``spec``: comma-separated clauses ``>=X``, ``>X``, ``<=X``, ``<X``, ``==X``, ``!=X``,
  ``~=X``. An empty spec accepts every version. A malformed spec raises `PluginError`."""
  have = release_tuple(version)
  for clause in filter(None, (c.strip() for c in spec.split(","))):
    m = _clause_re.match(clause)
    if m is None:
      raise PluginError(f"cannot parse version requirement {clause!r} in {spec!r}; "
                        "expected clauses like '>=0.1' or '<0.2'")
    op, want = m.group(1), tuple(int(x) for x in m.group(2).split("."))
    c = _cmp(have, want)
    ok = {">=": c >= 0, ">": c > 0, "<=": c <= 0, "<": c < 0, "==": c == 0, "!=": c != 0,
          "~=": c >= 0 and have[:max(len(want) - 1, 1)] == want[:max(len(want) - 1, 1)]}[op]
    if not ok: return False
  return True

# ** the loaded state of one backend **

@dataclass
class BackendRecord:
  """One backend as core sees it. ``status``: ok, failed, incompatible or disabled (``reason`` says why)."""
  source: BackendSource
  status: str = "pending"
  reason: str = ""
  info: BackendInfo | None = None
  plugin: Any = None
  devices: list[DeviceEntry] = field(default_factory=list)
  renderers: list[RendererEntry] = field(default_factory=list)
  compilers: list[CompilerEntry] = field(default_factory=list)
  queues: list[QueueEntry] = field(default_factory=list)
  @property
  def name(self) -> str: return self.source.name
  @property
  def label(self) -> str: return f"{self.source.name} ({self.source.distribution} {self.source.version})"

@dataclass(frozen=True)
class DeviceReport:
  """A registered device, for the doctor: its backend, priority, interfaces, renderer names and any conflict."""
  name: str
  backend: str
  priority: int
  interfaces: tuple[str, ...]
  renderers: tuple[str, ...]
  conflict: str = ""

@dataclass(frozen=True)
class BackendReport:
  """A backend, for the doctor. ``status`` is ok, failed, incompatible or disabled, with ``reason``."""
  name: str
  distribution: str
  version: str
  builtin: bool
  status: str
  reason: str
  api_version: int | None
  requires_core: str
  priority: int
  description: str
  devices: tuple[DeviceReport, ...]

def _split_names(value: str) -> list[str]: return [n.strip().lower() for n in value.split(",") if n.strip()]

# ** probing in a child process **

def _can_fork() -> bool: return sys.platform == "linux" and threading.active_count() == 1

def _report_probe(registry: BackendRegistry, name: str, fd: int) -> None:
  """Run the probe here and write JSON lines to ``fd``: ``{"calling": label}`` before each backend's probe (line
  buffered, so it is out before a crash), then ``{"ok": ..., "reason": ...}``."""
  with open(fd, "w", buffering=1, closefd=False) as out:
    def announce(rec: BackendRecord) -> None: out.write(json.dumps({"calling": rec.label, "name": rec.name}) + "\n")
    result = registry.probe_here(name, announce)
    out.write(json.dumps({"ok": result.ok, "reason": result.reason}) + "\n")

def probe_child(config: str) -> None:
  """The spawned probe process: rebuild the parent's registry and ``DEV`` selection from ``config`` and report."""
  cfg = json.loads(config)
  sources = None if cfg["sources"] is None else [BackendSource(**s) for s in cfg["sources"]]
  registry = BackendRegistry(sources, allow=cfg["allow"], deny=cfg["deny"], builtin=cfg["builtin"],
                             plugins=cfg["plugins"])
  Device._dev = cfg["dev"]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    registry.load()
  _report_probe(registry, cfg["device"], cfg["fd"])

def _read_probe_output(fd: int) -> tuple[bytes, bool]:
  """Everything the probe process writes to the pipe ``fd`` until it closes it; True if it timed out first: after
  PROBE_START_TIMEOUT_S without any probe started, or PROBE_TIMEOUT_S after the last ``calling`` line."""
  chunks: list[bytes] = []
  deadline = time.monotonic() + PROBE_START_TIMEOUT_S
  while (left := deadline - time.monotonic()) > 0:
    if not select.select([fd], [], [], left)[0]: break
    if not (chunk := os.read(fd, 1 << 16)): return b"".join(chunks), False
    chunks.append(chunk)
    if b'"calling"' in chunk: deadline = time.monotonic() + PROBE_TIMEOUT_S
  return b"".join(chunks), True

def _wait_exit_code(pid: int) -> int:
  _, status = os.waitpid(pid, 0)
  return os.waitstatus_to_exitcode(status)

def _probe_answer(name: str, output: str, exit_code: int, timed_out: bool) -> ProbeResult:
  calling: dict[str, Any] = {}
  for line in output.splitlines():
    try: msg = json.loads(line)
    except ValueError: continue  # a line cut short by the crash
    if "calling" in msg: calling = msg
    elif not timed_out and exit_code == 0: return ProbeResult(bool(msg["ok"]), str(msg["reason"]))
  if timed_out:
    how = f"did not answer within {PROBE_TIMEOUT_S:g}s" if calling else \
          f"did not load its backends and start probing within {PROBE_START_TIMEOUT_S:g}s"
  elif exit_code < 0: how = f"killed the probe process with {_signal_name(-exit_code)}"
  else: how = f"ended the probe process with exit code {exit_code}"
  if not calling:
    return ProbeResult(False, f"probing device {name!r} in a child process failed before any ember_probe ran: it {how}")
  return ProbeResult(False, f"ember_probe({name!r}) of backend {calling['calling']} {how} (it ran in a child process, "
                            f"so this one survived); fix: repair or update that backend's driver or native library, or "
                            f"disable it with EMBER_DISABLE_BACKENDS={calling['name']}")

def _signal_name(signum: int) -> str:
  try: return signal.Signals(signum).name
  except ValueError: return f"signal {signum}"

def _plugin_warning(msg: str) -> None:
  warnings.warn(msg, PluginWarning, stacklevel=4)

class BackendRegistry:
  """Discovers and loads backends, and holds what they registered.

  ``sources`` defaults to the installed entry points; ``plugins`` (``EMBER_PLUGINS``) adds or replaces backends by
  module name; core's builtin plugin is always added first (unless ``builtin=False``). ``allow``/``deny`` are comma
  lists of backend names (``EMBER_BACKENDS`` / ``EMBER_DISABLE_BACKENDS``); the allow-list applies to installed
  backends, not to core's builtin one, which only the deny-list can switch off. ``strict`` raises at loading on any
  broken, incompatible or conflicting backend.
  """
  def __init__(self, sources: Iterable[BackendSource] | None = None, *, allow: str = "", deny: str = "",
               strict: bool = False, builtin: bool = True, plugins: str = ""):
    self._sources = None if sources is None else list(sources)
    self.plugins = plugins
    self.allow, self.deny, self.strict, self.builtin = _split_names(allow), _split_names(deny), strict, builtin
    self.loaded = False
    self._lock = threading.RLock()
    self._strict_error: str | None = None
    self.backends: list[BackendRecord] = []
    self.devices: dict[str, list[DeviceEntry]] = {}
    self.renderers: dict[str, list[RendererEntry]] = {}
    self.compilers: dict[tuple[str, str], list[CompilerEntry]] = {}
    self.queues: dict[tuple[str, str], list[QueueEntry]] = {}
    self.conflicts: dict[tuple[str, ...], str] = {}
    self._probes: dict[tuple[str, Target], ProbeResult] = {}

  @classmethod
  def from_env(cls, strict: bool | None = None) -> BackendRegistry:
    """Configured by EMBER_BACKENDS, EMBER_DISABLE_BACKENDS, EMBER_PLUGINS and (unless given) EMBER_STRICT_BACKENDS."""
    strict = bool(getenv("EMBER_STRICT_BACKENDS", 0)) if strict is None else strict
    return cls(allow=getenv("EMBER_BACKENDS", ""), deny=getenv("EMBER_DISABLE_BACKENDS", ""),
               plugins=getenv("EMBER_PLUGINS", ""), strict=strict)

  # ** loading **

  def load(self) -> BackendRegistry:
    """Import every enabled backend and run its registration hooks (once). Under ``strict``, raise `PluginError`."""
    with self._lock:
      if not self.loaded: self._load_all()
      if self._strict_error is not None: raise PluginError(self._strict_error)
      return self

  def _load_all(self) -> None:
    import pluggy
    from ember.plugin import EmberHookSpec  # the documented hook specifications live in the public plugin module
    self.pm: pluggy.PluginManager = pluggy.PluginManager(PROJECT_NAME)
    self.pm.add_hookspecs(EmberHookSpec)
    extra = env_plugin_sources(self.plugins)
    installed = entry_point_sources() if self._sources is None else self._sources
    installed = [s for s in installed if s.name not in {e.name for e in extra}] + extra
    sources = ([builtin_source()] if self.builtin else []) + installed
    self.backends = [BackendRecord(s) for s in sources]
    self._apply_filters()
    self._reject_duplicate_names()
    for rec in self.backends:
      if rec.status == "pending": self._load_one(rec)
    self._build_tables()
    self.loaded = True
    broken = [r for r in self.backends if r.status in ("failed", "incompatible")]
    problems = [f"backend {r.label} is {r.status}: {r.reason}" for r in broken]
    problems += list(self.conflicts.values())
    if self.strict and problems:
      listed = "\n  ".join(problems)
      self._strict_error = (f"EMBER_STRICT_BACKENDS=1 and some backends have problems:\n  {listed}\n"
                            "fix: repair or uninstall them, or unset EMBER_STRICT_BACKENDS to skip them with a warning")
      return
    for msg in problems[:len(broken)]: _plugin_warning(f"{msg}; its devices are unavailable (python -m ember devices)")
    for msg in problems[len(broken):]: _plugin_warning(f"{msg} (see `python -m ember devices`)")

  def _apply_filters(self) -> None:
    installed = {r.name for r in self.backends}
    for env, names in (("EMBER_BACKENDS", self.allow), ("EMBER_DISABLE_BACKENDS", self.deny)):
      for unknown in sorted(set(names) - installed):
        _plugin_warning(f"{env} names backend {unknown!r}, which is not installed; "
                        f"installed backends: {', '.join(sorted(installed))}")
    for rec in self.backends:
      if rec.name in self.deny:
        rec.status, rec.reason = "disabled", f"disabled by EMBER_DISABLE_BACKENDS={','.join(self.deny)}"
      elif self.allow and not rec.source.builtin and rec.name not in self.allow:
        rec.status, rec.reason = "disabled", f"not in EMBER_BACKENDS={','.join(self.allow)}"

  def _reject_duplicate_names(self) -> None:
    by_name: dict[str, list[BackendRecord]] = {}
    for rec in self.backends: by_name.setdefault(rec.name, []).append(rec)
    for name, recs in by_name.items():
      if len(recs) < 2: continue
      who = ", ".join(f"{r.source.distribution} {r.source.version}" for r in recs)
      for rec in recs:
        if rec.source.builtin or rec.status == "disabled": continue
        rec.status = "failed"
        rec.reason = (f"backend name {name!r} is declared by several distributions ({who}); ember will not pick one; "
                      f"fix: uninstall all but one of them")

  def _fail(self, rec: BackendRecord, status: str, reason: str) -> None:
    rec.status, rec.reason = status, reason
    rec.devices, rec.renderers, rec.compilers, rec.queues = [], [], [], []
    if rec.plugin is not None and self.pm.is_registered(rec.plugin): self.pm.unregister(rec.plugin)

  def _has_impl(self, rec: BackendRecord, hook: str) -> bool:
    return any(impl.plugin is rec.plugin for impl in getattr(self.pm.hook, hook).get_hookimpls())

  def _call(self, rec: BackendRecord, hook: str, **kwargs: Any) -> list[Any]:
    """Call one hook of one backend only (a pluggy subset caller), so a failure is attributed to that backend."""
    others = [p for p in self.pm.get_plugins() if p is not rec.plugin]
    return self.pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

  def _load_one(self, rec: BackendRecord) -> None:
    what = f"plugin {rec.source.value!r} of backend {rec.label}"
    try: rec.plugin = rec.source.load()
    except Exception as e:  # noqa: BLE001  an installed backend's import error is recorded and reported, not fatal
      return self._fail(rec, "failed", f"importing {what} raised {type(e).__name__}: {e}")
    try: self.pm.register(rec.plugin, name=f"ember-backend:{rec.name}")
    except Exception as e:  # noqa: BLE001  pluggy rejects hookimpls whose arguments do not match the spec
      rec.plugin = None
      return self._fail(rec, "failed", f"registering {what} failed: {type(e).__name__}: {e}")
    if not self._has_impl(rec, "ember_backend_info"):
      return self._fail(rec, "failed", f"{what} does not implement the required hook ember_backend_info")
    try: infos = self._call(rec, "ember_backend_info")
    except Exception as e:  # noqa: BLE001
      return self._fail(rec, "failed", f"ember_backend_info of {what} raised {type(e).__name__}: {e}")
    info = infos[0] if infos else None
    if not isinstance(info, BackendInfo):
      return self._fail(rec, "failed", f"ember_backend_info of {what} returned {info!r}, "
                                       "not an ember.plugin.BackendInfo")
    rec.info = info
    if info.name.strip().lower() != rec.name:
      return self._fail(rec, "failed", f"{what} calls itself {info.name!r} but its entry point is named {rec.name!r}; "
                                       f"fix: make the entry-point name and BackendInfo.name agree")
    if (problem := self._compat_problem(rec, info)) is not None: return self._fail(rec, "incompatible", problem)
    devices, renderers = DeviceRegistry(rec.name), RendererRegistry(rec.name)
    compilers, queues = CompilerRegistry(rec.name), QueueRegistry(rec.name)
    calls: list[tuple[str, Any]] = [("ember_register_devices", devices), ("ember_register_renderers", renderers),
                                    ("ember_register_compilers", compilers), ("ember_register_queues", queues)]
    for hook, registry in calls:
      try: self._call(rec, hook, registry=registry)
      except Exception as e:  # noqa: BLE001
        return self._fail(rec, "failed", f"{hook} of {what} raised {type(e).__name__}: {e}")
    rec.devices, rec.renderers = devices.entries, renderers.entries
    rec.compilers, rec.queues = compilers.entries, queues.entries
    rec.status = "ok"

  def _compat_problem(self, rec: BackendRecord, info: BackendInfo) -> str | None:
    from ember import __version__ as core_version
    dist = rec.source.distribution
    if info.api_version != PLUGIN_API_VERSION:
      if info.api_version < PLUGIN_API_VERSION:
        fix = (f"upgrade {dist} to a release built for plugin API {PLUGIN_API_VERSION}, "
               f"or install an ember-core release that provides plugin API {info.api_version}")
      else:
        fix = (f"upgrade ember-core to a release that provides plugin API {info.api_version}, "
               f"or install a release of {dist} built for plugin API {PLUGIN_API_VERSION}")
      return (f"backend {rec.label} was written for plugin API version {info.api_version}, "
              f"but ember-core {core_version} provides plugin API version {PLUGIN_API_VERSION}; fix: {fix}")
    try: ok = version_satisfies(core_version, info.requires_core)
    except PluginError as e: return f"backend {rec.label} declares requires_core={info.requires_core!r}: {e}"
    if not ok:
      return (f"backend {rec.label} requires ember-core {info.requires_core} but ember-core {core_version} is "
              f"installed; fix: pip install 'ember-core{info.requires_core}', or install a release of {dist} that "
              f"supports ember-core {core_version}")
    return None

  def _build_tables(self) -> None:
    ok = [r for r in self.backends if r.status == "ok"]
    backend_priority = {r.name: r.info.priority if r.info is not None else 0 for r in ok}
    for rec in ok:
      for d in rec.devices: self.devices.setdefault(d.name, []).append(d)
      for r in rec.renderers: self.renderers.setdefault(r.device, []).append(r)
      for c in rec.compilers: self.compilers.setdefault((c.device, c.renderer), []).append(c)
      for q in rec.queues: self.queues.setdefault((q.device, q.interface), []).append(q)
    for entries in self.renderers.values(): entries.sort(key=lambda r: (-r.priority, -backend_priority[r.backend]))
    labels = {r.name: r.label for r in self.backends}
    def check(kind: str, key: tuple[str, ...], owners: list[str]) -> None:
      # a conflict on a device already covers its renderers, compilers and queues
      if len(set(owners)) < 2 or (key[0] != "device" and ("device", key[1]) in self.conflicts): return
      who = ", ".join(labels[o] for o in owners)
      self.conflicts[key] = (f"{kind} is registered by {len(owners)} backends: {who}; ember will not choose one; "
                             f"fix: uninstall one of those distributions or set EMBER_DISABLE_BACKENDS={owners[-1]}")
    for name, devs in self.devices.items(): check(f"device {name}", ("device", name), [d.backend for d in devs])
    for device, rends in self.renderers.items():
      for rname in dict.fromkeys(r.name for r in rends):
        owners = [r.backend for r in rends if r.name == rname]
        check(f"renderer {rname} of device {device}", ("renderer", device, rname), owners)
    for (device, rname), comps in self.compilers.items():
      check(f"the compiler for {device}:{rname}", ("compiler", device, rname), [c.backend for c in comps])
    for (device, iface), queues in self.queues.items():
      check(f"interface {iface} of device {device}", ("queue", device, iface), [q.backend for q in queues])

  # ** lookups (each loads first) **

  def record(self, name: str) -> BackendRecord:
    self.load()
    for rec in self.backends:
      if rec.name == name: return rec
    raise PluginError(f"no backend named {name!r}; installed backends: {', '.join(r.name for r in self.backends)}")

  def device_entry(self, name: str) -> DeviceEntry:
    """The registration of device ``name`` (upper-case, no index); `PluginError` for a conflict or a broken backend."""
    self.load()
    if (conflict := self.conflicts.get(("device", name))) is not None: raise PluginError(conflict)
    if (entries := self.devices.get(name)): return entries[0]
    raise self._missing_device_error(name)

  def _missing_device_error(self, name: str) -> DeviceError:
    available = ", ".join(sorted(self.devices)) or "none"
    broken = [r for r in self.backends if r.status in ("failed", "incompatible", "disabled")]
    for rec in broken:
      if rec.name == name.lower():  # a backend that did not load cannot tell us its devices: match it by name
        return PluginError(f"device {name} is unavailable because backend {rec.label} is {rec.status}: {rec.reason}")
    if broken:
      listed = "; ".join(f"{r.label} is {r.status}: {r.reason}" for r in broken)
      return PluginError(f"unknown device {name!r}; available devices: {available}. These backends did not load and "
                         f"might provide it: {listed}")
    return DeviceError(f"unknown device {name!r}; available devices: {available}; fix: install the backend that "
                       f"provides it (e.g. pip install ember-backend-{name.lower()}) and check "
                       "`python -m ember devices`")

  def probe(self, name: str) -> ProbeResult:
    """Ask the backends (``ember_probe``, firstresult) whether device ``name`` is usable; no answer means usable.

    The first probe of a device (per ``DEV`` selection) runs in a child process, so a probe that crashes it (a native
    library calling abort(), a segfault) or hangs makes the device unavailable, naming the backend, instead of killing
    this interpreter. The answer is kept for the rest of this process."""
    self.load()
    key = (name, Device.get_target(name))
    with self._lock:
      if (result := self._probes.get(key)) is None: result = self._probes[key] = self._probe_isolated(name)
    return result

  def probe_here(self, name: str, announce: Callable[[BackendRecord], None] = lambda rec: None) -> ProbeResult:
    """`probe` in this process, without isolation: each backend's ``ember_probe`` in pluggy's firstresult order, with
    ``announce(record)`` called before each runs (the isolated probe reports it, to name the backend that crashed)."""
    self.load()
    by_plugin = {id(r.plugin): r for r in self.backends if r.plugin is not None}
    for impl in reversed(self.pm.hook.ember_probe.get_hookimpls()):  # the order pluggy calls them in
      rec = by_plugin[id(impl.plugin)]
      announce(rec)
      try: result = self._call(rec, "ember_probe", device=name)
      except Exception as e:  # noqa: BLE001  a crashing probe means "not usable", with the exception as the reason
        return ProbeResult(False, f"ember_probe({name!r}) raised {type(e).__name__}: {e} (backend {rec.label})")
      if result is None: continue
      if not isinstance(result, ProbeResult):
        return ProbeResult(False, f"ember_probe({name!r}) of backend {rec.label} returned {result!r}, "
                                  "not an ember.plugin.ProbeResult")
      return result
    return ProbeResult(True)

  def _probe_isolated(self, name: str) -> ProbeResult:
    # fork is cheap and the child already has every plugin loaded; it is safe only without other threads, and never on
    # macOS, whose system frameworks (Metal's probe) break in a forked child. Elsewhere a fresh interpreter probes.
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as pipe:
      try:
        if _can_fork(): child = self._fork_probe(name, read_fd, write_fd)
        else: child = self._spawn_probe(name, write_fd)
      finally: os.close(write_fd)  # the child holds the only writer now: EOF comes when it exits
      output, timed_out = _read_probe_output(pipe.fileno())
    if timed_out: os.kill(child, signal.SIGKILL)
    return _probe_answer(name, output.decode(errors="replace"), _wait_exit_code(child), timed_out)

  def _fork_probe(self, name: str, read_fd: int, write_fd: int) -> int:
    pid = os.fork()
    if pid != 0: return pid
    code = 1  # the child: probe, report through the pipe, leave without running this process's atexit handlers
    try:
      faulthandler.disable()  # a crash dump would show the parent's stack, as if this process had died
      os.close(read_fd)
      _report_probe(self, name, write_fd)
      code = 0
    finally: os._exit(code)

  def _spawn_probe(self, name: str, write_fd: int) -> int:
    config = {"device": name, "fd": write_fd, "allow": ",".join(self.allow), "deny": ",".join(self.deny),
              "builtin": self.builtin, "plugins": self.plugins,
              "sources": None if self._sources is None else [asdict(s) for s in self._sources],
              "dev": Device._dev if Device._dev is not None else getenv("DEV", "")}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the child sees what we see
    code = "import sys; from ember.device.registry import probe_child; probe_child(sys.argv[1])"
    try: proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(config)], pass_fds=(write_fd,), env=env)
    except OSError as e: raise DeviceError(f"cannot start a process to probe device {name}: {e}") from e
    return proc.pid

  def renderer_entries(self, device: str) -> list[RendererEntry]:
    """Renderers registered for ``device`` (by any backend), highest priority first."""
    return self.load().renderers.get(device, [])

  def compiler_entry(self, device: str, renderer: str) -> CompilerEntry | None:
    self.load()
    if (conflict := self.conflicts.get(("compiler", device, renderer))) is not None: raise PluginError(conflict)
    entries = self.compilers.get((device, renderer))
    return entries[0] if entries else None

  def interfaces(self, device: str) -> tuple[str, ...]:
    """Interfaces of ``device``: declared with the device, or registered as queues by any backend."""
    self.load()
    declared = [i for d in self.devices.get(device, []) for i in d.interfaces]
    return tuple(dict.fromkeys(declared + [iface for (dev, iface) in self.queues if dev == device]))

  def queue_factory(self, device: str, interface: str) -> Any:
    self.load()
    if (conflict := self.conflicts.get(("queue", device, interface))) is not None: raise PluginError(conflict)
    entries = self.queues.get((device, interface))
    if not entries:
      registered = ", ".join(self.interfaces(device)) or "none"
      raise DeviceError(f"device {device} has no queue interface {interface!r}; registered: {registered}")
    return entries[0].factory

  def auto_candidates(self) -> list[DeviceEntry]:
    """Devices that `Device.DEFAULT` may choose when ``DEV`` is unset, best first: non-negative priority, at least one
    renderer, not MOCK-only, not in conflict. The probe decides among them."""
    self.load()
    backend_priority = {r.name: r.info.priority if r.info is not None else 0 for r in self.backends}
    out = []
    for name, entries in self.devices.items():
      entry = entries[0]
      if ("device", name) in self.conflicts or entry.priority < 0 or not self.renderers.get(name): continue
      if entry.interfaces and all(i.startswith("MOCK") for i in entry.interfaces): continue
      out.append(entry)
    return sorted(out, key=lambda e: (-e.priority, -backend_priority.get(e.backend, 0), e.name))

  def report(self) -> list[BackendReport]:
    """Every backend with its status and registrations, for `python -m ember devices`."""
    self.load()
    out = []
    for rec in self.backends:
      devices = tuple(DeviceReport(d.name, d.backend, d.priority, self.interfaces(d.name),
                                   tuple(dict.fromkeys(r.name for r in self.renderers.get(d.name, []))),
                                   self.conflicts.get(("device", d.name), "")) for d in rec.devices)
      info, src = rec.info, rec.source
      out.append(BackendReport(rec.name, src.distribution, src.version, src.builtin, rec.status, rec.reason,
                               info.api_version if info else None, info.requires_core if info else "",
                               info.priority if info else 0, info.description if info else "", devices))
    return out

# ** the Device singleton **

_canon_re = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::(.*))?$", re.DOTALL)

class _Device:
  """Opens devices by name and chooses the default one. Use the module-level `Device` singleton.

  ``Device["CPU"]``, ``Device["cpu:0"]`` and ``Device["CPU:1"]`` return `Compiled` instances, cached per canonical
  name. ``Device.DEFAULT`` is the device named by ``DEV`` or, when ``DEV`` is unset, the highest-priority usable one.
  """
  def __init__(self, registry: BackendRegistry | None = None, dev: str | None = None):
    self._registry, self._dev = registry, dev
    self._opened: dict[str, Compiled] = {}
    self._default: str | None = None
    self._dev_cache: tuple[str, Target | None] | None = None
    self._lock = threading.RLock()
    self._finalizer_registered = False

  @property
  def registry(self) -> BackendRegistry:
    if self._registry is None: self._registry = BackendRegistry.from_env()
    return self._registry.load()

  def __getitem__(self, name: str) -> Compiled:
    dev = self._opened.get(name)  # the hot path: one dict lookup
    return dev if dev is not None else self._open(name)

  # ** names and DEV **

  def canonicalize(self, name: str) -> str:
    """The canonical device string: ``"cpu"`` -> ``"CPU"``, ``"CPU:0"`` -> ``"CPU"``, ``"cpu:1"`` -> ``"CPU:1"``,
    ``"disk:/a/b"`` -> ``"DISK:/a/b"``. Raises `DeviceError` for a string that is not a device name."""
    m = _canon_re.match(name.strip()) if isinstance(name, str) else None
    if m is None:
      has_iface = isinstance(name, str) and "+" in name
      hint = "; an interface is chosen with DEV=IFACE+DEVICE, not in a device name" if has_iface else ""
      raise DeviceError(f"invalid device name {name!r}; expected DEVICE or DEVICE:N such as 'CPU', 'CPU:1', "
                        f"'DISK:/path'{hint}")
    head, rest = m.group(1).upper(), m.group(2)
    if not rest: return head
    if rest.isdigit(): return head if int(rest) == 0 else f"{head}:{int(rest)}"
    return f"{head}:{rest}"

  def _dev_target(self) -> Target | None:
    dev = (getenv("DEV", "") if self._dev is None else self._dev).strip()
    if self._dev_cache is None or self._dev_cache[0] != dev: self._dev_cache = (dev, parse_target(dev) if dev else None)
    return self._dev_cache[1]

  def get_target(self, name: str) -> Target:
    """The selection for device ``name``: interface, renderer and arch come from ``DEV`` when it names this device."""
    head, _, rest = self.canonicalize(name).partition(":")
    index = int(rest) if rest.isdigit() else 0
    dev = self._dev_target()
    if dev is not None and dev.device == head: return Target(head, dev.interface, dev.renderer, dev.arch, index)
    return Target(head, index=index)

  @property
  def DEFAULT(self) -> str:  # noqa: N802  the name users know from tinygrad
    if self._default is None: self._default = self._select_default()
    return self._default
  @DEFAULT.setter
  def DEFAULT(self, value: str) -> None:  # noqa: N802
    """Select like ``DEV`` does: ``Device.DEFAULT = "CPU:LLVM"``. Devices already opened keep their renderer."""
    target = parse_target(value)
    self._dev, self._default = value, target.device_str

  def _select_default(self) -> str:
    target = self._dev_target()
    if target is not None: return target.device_str
    tried = []
    for entry in self.registry.auto_candidates():
      result = self.registry.probe(entry.name)
      if result.ok: return entry.name
      tried.append(f"{entry.name}: {result.reason}")
    detail = "; ".join(tried) if tried else "no backend registers a device that can run kernels"
    raise DeviceError(f"no usable device found ({detail}); fix: install a backend (pip install ember-backend-cpu) "
                      "or set DEV=PYTHON")

  # ** opening **

  def _open(self, name: str) -> Compiled:
    with self._lock:
      canon = self.canonicalize(name)
      if (dev := self._opened.get(canon)) is None:
        dev = self._open_canonical(canon)
        self._opened[canon] = dev
        if not self._finalizer_registered:
          atexit.register(self._finalize_all)
          self._finalizer_registered = True
      self._opened[name] = dev
      return dev

  def _open_canonical(self, canon: str) -> Compiled:
    registry = self.registry
    head, _, rest = canon.partition(":")
    entry = registry.device_entry(head)
    if rest and not rest.isdigit() and any(r.name == rest.upper() for r in registry.renderer_entries(head)):
      raise DeviceError(f"Device[{canon!r}]: {rest!r} is a renderer, not a device index; Device[...] takes 'DEVICE' or "
                        f"'DEVICE:N'; fix: choose the renderer with DEV={head}:{rest.upper()}")
    target = self.get_target(canon)
    probe = registry.probe(head)
    label = registry.record(entry.backend).label
    if not probe.ok: raise DeviceError(f"device {canon} (backend {label}) is unavailable: {probe.reason}")
    if target.interface and target.interface not in (ifaces := registry.interfaces(head)):
      raise DeviceError(f"device {head} has no interface {target.interface!r} (from DEV); "
                        f"its interfaces: {', '.join(ifaces) or 'none'}")
    renderer, renderer_name = self._select_renderer(target)
    compiler = self._build_compiler(head, renderer_name, renderer) if renderer is not None else None
    try: dev = entry.factory(canon, renderer, compiler)
    except EmberError: raise
    except Exception as e:
      raise DeviceError(f"opening device {canon} (backend {label}) failed: {type(e).__name__}: {e}") from e
    if not isinstance(dev, Compiled):
      raise PluginError(f"the factory of device {head} (backend {entry.backend!r}) returned {dev!r}, "
                        "not an ember.plugin.Compiled")
    return dev

  def _select_renderer(self, target: Target) -> tuple[Renderer | None, str]:
    registry = self.registry
    device = target.device
    candidates = registry.renderer_entries(device)
    names = list(dict.fromkeys(c.name for c in candidates))
    if target.renderer:
      conflict = registry.conflicts.get(("renderer", device, target.renderer))
      if conflict is not None: raise PluginError(conflict)
      match = [c for c in candidates if c.name == target.renderer]
      if not match:
        fix = f"; fix: e.g. DEV={device}:{names[0]}" if names else ""
        raise DeviceError(f"device {device} has no renderer {target.renderer!r} (from DEV); "
                          f"its renderers: {', '.join(names) or 'none'}{fix}")
      chosen = match[0]
      try: return self._check_renderer(chosen, chosen.factory(target.arch)), chosen.name
      except EmberError: raise
      except Exception as e:
        raise DeviceError(f"renderer {chosen.name} of device {device} (backend {chosen.backend!r}) failed to load: "
                          f"{type(e).__name__}: {e}; DEV asks for it explicitly, so ember does not fall back to "
                          "another renderer") from e
    failures = []
    for cand in candidates:
      if (conflict := registry.conflicts.get(("renderer", device, cand.name))) is not None: raise PluginError(conflict)
      try: return self._check_renderer(cand, cand.factory(target.arch)), cand.name
      except Exception as e:  # noqa: BLE001  first renderer that builds wins; if none does, every reason is reported
        failures.append(f"{cand.name} (backend {cand.backend!r}): {type(e).__name__}: {e}")
    if not candidates: return None, ""
    raise DeviceError(f"no renderer of device {device} could be built: {'; '.join(failures)}; "
                      f"fix: install what the renderer needs, or pick another with DEV={device}:<RENDERER>")

  @staticmethod
  def _check_renderer(entry: RendererEntry, renderer: Any) -> Renderer:
    from ember.renderer import Renderer
    if not isinstance(renderer, Renderer):
      raise PluginError(f"renderer {entry.name} of device {entry.device} (backend {entry.backend!r}) built "
                        f"{renderer!r}, "
                        f"not an ember.plugin.Renderer")
    return renderer

  def _build_compiler(self, device: str, renderer_name: str, renderer: Renderer) -> Compiler | None:
    from ember.device.base import Compiler
    entry = self.registry.compiler_entry(device, renderer_name)
    if entry is None: return None
    try: compiler = entry.factory(renderer)
    except EmberError: raise
    except Exception as e:
      raise DeviceError(f"the compiler for {device}:{renderer_name} (backend {entry.backend!r}) failed to load: "
                        f"{type(e).__name__}: {e}") from e
    if not isinstance(compiler, Compiler):
      raise PluginError(f"the compiler factory for {device}:{renderer_name} (backend {entry.backend!r}) built "
                        f"{compiler!r}, "
                        f"not an ember.plugin.Compiler")
    return compiler

  def queue_factory(self, device: str, interface: str) -> Any:
    """The factory registered for ``(device, interface)`` through ``ember_register_queues``."""
    return self.registry.queue_factory(self.canonicalize(device).partition(":")[0], interface.upper())

  def backends(self) -> list[BackendReport]:
    """Every installed backend (core's builtin one included) with its status, for the doctor."""
    return self.registry.report()

  def _finalize_all(self) -> None:
    for dev in dict.fromkeys(self._opened.values()): dev.finalize()

Device = _Device()

def list_backends() -> list[BackendReport]:
  """Every installed backend with its status and registrations (what `python -m ember devices` prints)."""
  return Device.backends()
