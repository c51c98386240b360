"""Backend discovery, isolation of broken backends, DEV selection and the Device singleton."""
from __future__ import annotations
import json
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ember.device import registry as registry_module
from ember.device.registry import BackendRegistry, _Device, version_satisfies
from ember.errors import DeviceError, PluginError
from ember.helpers import Target
from ember.plugin import PLUGIN_API_VERSION, Compiled, PluginWarning

BROKEN = "raise ImportError('libbroken.so: cannot open shared object file')\n"

# ** version requirements, against packaging as the oracle **

@pytest.mark.parametrize("version", ["0.1.0", "0.1", "0.2.0", "1.0.0", "0.0.9", "0.1.5", "2.3"])
@pytest.mark.parametrize("spec", ["", ">=0.1,<0.2", ">0.1", "<=0.1.0", "==0.1.0", "!=0.1", "~=0.1", "~=0.1.0",
                                  ">=0.2, <1.0"])
def test_version_satisfies_matches_packaging(version: str, spec: str) -> None:
  assert version_satisfies(version, spec) == SpecifierSet(spec).contains(Version(version))

@pytest.mark.parametrize("spec", [">=x", "0.1", ">=0.1;<0.2", "=>0.1"])
def test_version_spec_malformed(spec: str) -> None:
  with pytest.raises(PluginError, match="cannot parse version requirement"): version_satisfies("0.1.0", spec)

# ** names and DEV parsing **

@pytest.mark.parametrize("name, canonical", [("CPU", "CPU"), ("cpu", "CPU"), ("CPU:0", "CPU"), ("cpu:1", "CPU:1"),
                                             ("NULL:02", "NULL:2"), ("disk:/tmp/a:b", "DISK:/tmp/a:b"),
                                             (" Python ", "PYTHON")])
def test_canonicalize(name: str, canonical: str) -> None:
  assert _Device(BackendRegistry([]), dev="").canonicalize(name) == canonical

@pytest.mark.parametrize("name", ["", "1CPU", "MOCK+NV", ":1", "CPU LLVM"])
def test_canonicalize_rejects(name: str) -> None:
  with pytest.raises(DeviceError, match="invalid device name"): _Device(BackendRegistry([]), dev="").canonicalize(name)

@pytest.mark.parametrize("dev, name, target", [
  ("CPU", "CPU", Target("CPU")),
  ("CPU:1", "CPU:1", Target("CPU", index=1)),
  ("CPU:LLVM", "CPU", Target("CPU", renderer="LLVM")),
  ("cpu:llvm", "CPU:3", Target("CPU", renderer="LLVM", index=3)),
  ("MOCK+NV:PTX:sm_90", "NV", Target("NV", interface="MOCK", renderer="PTX", arch="sm_90")),
  ("NULL::gfx1100", "NULL", Target("NULL", arch="gfx1100")),
  ("NULL::gfx1100", "CPU", Target("CPU")),  # DEV names another device: nothing applies to CPU
])
def test_dev_target(dev: str, name: str, target: Target) -> None:
  assert _Device(BackendRegistry([]), dev=dev).get_target(name) == target

@pytest.mark.parametrize("dev, default", [("CPU", "CPU"), ("CPU:1", "CPU:1"), ("CPU:LLVM", "CPU"),
                                          ("MOCK+NV:PTX:sm_90", "NV"), ("NULL::gfx1100", "NULL"), ("python", "PYTHON")])
def test_dev_default(dev: str, default: str) -> None:
  assert _Device(BackendRegistry([]), dev=dev).DEFAULT == default

@pytest.mark.parametrize("dev", ["1CPU", "CPU:A:B:C", "+CPU", "CPU LLVM", "CPU+"])
def test_dev_bad_strings_raise(dev: str) -> None:
  with pytest.raises(DeviceError): _Device(BackendRegistry([]), dev=dev).DEFAULT  # noqa: B018

# ** loading and opening (in process, with explicit sources) **

def test_toy_backend_opens_and_caches(fake_site) -> None:
  module = fake_site.add_toy("toy", renderers=("TC", "TL"))
  dev = _Device(fake_site.registry(strict=True), dev="")
  toy = dev["toy"]
  assert isinstance(toy, Compiled) and toy.device == "TOY"
  assert toy.renderer.name == "TC" and toy.compiler.renderer is toy.renderer  # highest priority renderer, its compiler
  assert dev["TOY"] is toy and dev["TOY:0"] is toy and dev["toy"] is toy
  assert dev["TOY:1"] is not toy and dev["TOY:1"].device == "TOY:1"
  import sys
  assert sys.modules[module].OPENED == ["TOY", "TOY:1"]  # the factory ran once per canonical device

def test_dev_selects_renderer_and_arch(fake_site) -> None:
  fake_site.add_toy("toy", renderers=("TC", "TL"))
  toy = _Device(fake_site.registry(strict=True), dev="TOY:TL:v9")["TOY"]
  assert (toy.renderer.name, toy.renderer.arch) == ("TL", "v9")

def test_unknown_renderer_in_dev(fake_site) -> None:
  fake_site.add_toy("toy", renderers=("TC", "TL"))
  with pytest.raises(DeviceError, match=r"no renderer 'XX'.*TC, TL"): _Device(fake_site.registry(), dev="TOY:XX")["TOY"]

def test_renderer_in_device_name_is_rejected(fake_site) -> None:
  fake_site.add_toy("toy", renderers=("TC", "TL"))
  with pytest.raises(DeviceError, match="DEV=TOY:TL"): _Device(fake_site.registry(), dev="")["TOY:TL"]

FAILING_RENDERER = '''
@hookimpl
def ember_register_renderers(registry):
  def fails(arch): raise OSError("libfancy.so not found")
  registry.add("TOY", "FANCY", fails, priority=5)
  registry.add("TOY", "TC", lambda arch: ToyRenderer("TC", arch))
'''

def test_explicit_renderer_failure_does_not_fall_back(fake_site) -> None:
  fake_site.add_toy("toy", extra=FAILING_RENDERER)
  with pytest.raises(DeviceError, match=r"FANCY.*libfancy.so not found.*does not fall back"):
    _Device(fake_site.registry(), dev="TOY:FANCY")["TOY"]

def test_auto_renderer_takes_first_that_builds(fake_site) -> None:
  fake_site.add_toy("toy", extra=FAILING_RENDERER)
  assert _Device(fake_site.registry(), dev="")["TOY"].renderer.name == "TC"

def test_third_party_renderer_for_foreign_device(fake_site) -> None:
  fake_site.add_toy("toy")
  fake_site.add("extra", '''
from ember.plugin import PLUGIN_API_VERSION, BackendInfo, Renderer, hookimpl
class ExtraRenderer(Renderer):
  def __init__(self, arch): self.arch = arch
  def render(self, uops, name="kernel"): return "extra"
@hookimpl
def ember_backend_info(): return BackendInfo("extra", PLUGIN_API_VERSION, ">=0.1")
@hookimpl
def ember_register_renderers(registry): registry.add("TOY", "EXTRA", ExtraRenderer)
''')
  dev = _Device(fake_site.registry(strict=True), dev="TOY:EXTRA:e1")
  toy = dev["TOY"]
  assert type(toy.renderer).__name__ == "ExtraRenderer" and toy.renderer.arch == "e1"
  assert toy.compiler is None  # nobody registered a compiler for TOY:EXTRA
  report = {b.name: b for b in dev.backends()}
  assert report["toy"].devices[0].renderers == ("TC", "EXTRA")

def test_broken_backend_is_isolated(fake_site) -> None:
  fake_site.add("broken", BROKEN)
  fake_site.add_toy("toy")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match="libbroken.so") as record: registry.load()
  assert len([w for w in record if "libbroken" in str(w.message)]) == 1
  rec = registry.record("broken")
  assert rec.status == "failed" and "ImportError" in rec.reason and "libbroken.so" in rec.reason
  dev = _Device(registry, dev="")
  assert dev["TOY"].device == "TOY"  # the other backend still works
  with pytest.raises(PluginError, match=r"ember-backend-broken 1.0.0.*libbroken.so"): dev["BROKEN"]
  with pytest.raises(PluginError, match=r"unknown device 'NOPE'.*might provide it.*libbroken.so"): dev["NOPE"]

def test_strict_raises_at_loading(fake_site) -> None:
  fake_site.add("broken", BROKEN)
  fake_site.add_toy("toy")
  dev = _Device(fake_site.registry(strict=True), dev="")
  for _ in range(2):  # every use raises, not only the first
    with pytest.raises(PluginError, match=r"(?s)EMBER_STRICT_BACKENDS=1.*libbroken.so"): dev["TOY"]

@pytest.mark.parametrize("hook", ["ember_backend_info", "ember_register_devices", "ember_register_renderers",
                                  "ember_register_compilers", "ember_register_queues"])
def test_raising_hook_fails_the_backend(fake_site, hook: str) -> None:
  args = "" if hook == "ember_backend_info" else "registry"
  fake_site.add_toy("toy", extra=f"\n@hookimpl\ndef {hook}({args}): raise RuntimeError('boom in {hook}')\n")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match=f"boom in {hook}"): registry.load()
  assert registry.record("toy").status == "failed" and "TOY" not in registry.devices

def test_missing_backend_info(fake_site) -> None:
  fake_site.add("bare", "from ember.plugin import hookimpl\n@hookimpl\ndef ember_register_devices(registry): pass\n")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match="does not implement the required hook ember_backend_info"): registry.load()

def test_name_mismatch(fake_site) -> None:
  extra = "\n@hookimpl\ndef ember_backend_info(): return BackendInfo('other', PLUGIN_API_VERSION, '')\n"
  fake_site.add_toy("toy", extra=extra)
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match="calls itself 'other'"): registry.load()

@pytest.mark.parametrize("api_version, fix", [(PLUGIN_API_VERSION + 998, "upgrade ember-core"),
                                              (0, "upgrade ember-backend-future")])
def test_incompatible_api_version(fake_site, api_version: int, fix: str) -> None:
  fake_site.add_toy("future", devices=("FUT",), api_version=str(api_version))
  registry = fake_site.registry()
  with pytest.warns(PluginWarning): registry.load()
  rec = registry.record("future")
  assert rec.status == "incompatible"
  assert f"plugin API version {api_version}" in rec.reason and f"plugin API version {PLUGIN_API_VERSION}" in rec.reason
  assert fix in rec.reason and "ember-backend-future" in rec.reason
  with pytest.raises(PluginError, match="incompatible"): _Device(registry, dev="")["FUTURE"]

def test_incompatible_core_version(fake_site) -> None:
  import ember
  fake_site.add_toy("old", devices=("OLD",), requires_core=">=99.0")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning): registry.load()
  rec = registry.record("old")
  assert rec.status == "incompatible" and ">=99.0" in rec.reason and ember.__version__ in rec.reason
  assert "pip install 'ember-core>=99.0'" in rec.reason

def test_conflicting_device_is_never_resolved(fake_site) -> None:
  fake_site.add_toy("dupa", devices=("DUP",), dist="dist-a")
  fake_site.add_toy("dupb", devices=("DUP",), dist="dist-b")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match="device DUP is registered by 2 backends"): registry.load()
  with pytest.raises(PluginError, match=r"dist-a 1.0.0.*dist-b 1.0.0"): _Device(registry, dev="")["DUP"]
  assert all(d.conflict for b in registry.report() for d in b.devices if d.name == "DUP")
  with pytest.raises(PluginError, match="DUP"): fake_site.registry(strict=True).load()

def test_duplicate_backend_name(fake_site) -> None:
  fake_site.add_toy("twin", dist="dist-one")
  fake_site.add_toy("twin", dist="dist-two")
  registry = fake_site.registry()
  with pytest.warns(PluginWarning, match="declared by several distributions"): registry.load()
  assert [r.status for r in registry.backends if r.name == "twin"] == ["failed", "failed"]

def test_allow_and_deny_lists(fake_site) -> None:
  fake_site.add("broken", BROKEN)
  fake_site.add_toy("toy")
  fake_site.add_toy("other", devices=("OTHER",))
  allowed = fake_site.registry(strict=True, allow="toy").load()  # strict, yet the broken one is never imported
  expected = {"core": "ok", "broken": "disabled", "other": "disabled", "toy": "ok"}
  assert {r.name: r.status for r in allowed.backends} == expected
  with pytest.raises(PluginError, match="not in EMBER_BACKENDS=toy"): _Device(allowed, dev="")["OTHER"]
  denied = fake_site.registry(strict=True, deny="broken, OTHER").load()
  assert {r.name: r.status for r in denied.backends} == expected
  no_core = fake_site.registry(strict=True, deny="core,broken").load()
  assert "PYTHON" not in no_core.devices and "TOY" in no_core.devices
  with pytest.warns(PluginWarning, match="'typo', which is not installed"): fake_site.registry(allow="toy,typo").load()

PROBE = '''
@hookimpl
def ember_probe(device):
  if device in {no!r}: return ProbeResult(False, "no " + device.lower() + " hardware here")
  return None
'''

def test_default_is_highest_priority_usable(fake_site) -> None:
  fake_site.add_toy("big", devices=("BIG",), priority=300, extra=PROBE.format(no=("BIG",)))
  fake_site.add_toy("mid", devices=("MID",), priority=200)
  fake_site.add_toy("mock", devices=("MOCKY",), priority=900, interfaces=("MOCK",))
  fake_site.add_toy("low", devices=("LOW",), priority=100)
  dev = _Device(fake_site.registry(strict=True), dev="")
  assert dev.DEFAULT == "MID"  # BIG's probe says no, MOCKY is MOCK-only
  with pytest.raises(DeviceError, match="no big hardware here"): dev["BIG"]

def test_default_never_null_or_renderless(fake_site) -> None:
  fake_site.add_toy("neg", devices=("NEG",), priority=-5)
  fake_site.add_toy("bare", devices=("BARE",), renderers=(), priority=500)
  dev = _Device(fake_site.registry(strict=True, deny="core"), dev="")
  with pytest.raises(DeviceError, match="no usable device found"): dev.DEFAULT  # noqa: B018

def test_default_reports_probe_reasons(fake_site) -> None:
  fake_site.add_toy("big", devices=("BIG",), priority=300, extra=PROBE.format(no=("BIG",)))
  dev = _Device(fake_site.registry(deny="core"), dev="")
  with pytest.raises(DeviceError, match="BIG: no big hardware here"): dev.DEFAULT  # noqa: B018

def test_interfaces_and_mock(fake_site) -> None:
  fake_site.add_toy("gpu", devices=("GPU",), interfaces=("PCI",), extra='''
@hookimpl
def ember_register_queues(registry):
  registry.add("GPU", "MOCK", lambda: "mock queues")
''')
  registry = fake_site.registry(strict=True)
  assert registry.interfaces("GPU") == ("PCI", "MOCK")
  dev = _Device(registry, dev="MOCK+GPU")
  assert dev.get_target("GPU").interface == "MOCK" and dev["GPU"].device == "GPU"
  assert dev.queue_factory("gpu", "mock")() == "mock queues"
  with pytest.raises(DeviceError, match=r"no interface 'USB'.*PCI, MOCK"): _Device(registry, dev="USB+GPU")["GPU"]

def test_probe_exception_is_a_reason(fake_site) -> None:
  fake_site.add_toy("toy", extra="\n@hookimpl\ndef ember_probe(device): raise OSError('driver exploded')\n")
  with pytest.raises(DeviceError, match=r"unavailable: ember_probe\('TOY'\) raised OSError: driver exploded"):
    _Device(fake_site.registry(), dev="")["TOY"]

# ** a probe that crashes or hangs its process (abort() in a native library) never takes this one down **

ABORTING_PROBE = """
@hookimpl
def ember_probe(device):
  import os
  if device in {devices!r}: os.abort()
  return None
"""

COUNTING_PROBE = """
@hookimpl
def ember_probe(device):
  with open({path!r}, "a") as f: f.write(device + "\\n")  # a child process runs it: count in a file
  return ProbeResult(True, "counted")
"""

@pytest.fixture(params=["fork", "spawn"])
def probe_process(request, monkeypatch: pytest.MonkeyPatch) -> str:
  """Each isolation path: a forked child (Linux, one thread) and a fresh interpreter (elsewhere, or with threads)."""
  if request.param == "fork" and not registry_module._can_fork(): pytest.skip("fork is used on Linux, one thread only")
  monkeypatch.setattr(registry_module, "_can_fork", lambda: request.param == "fork")
  return request.param

def test_aborting_probe_is_a_device_error(fake_site, probe_process: str) -> None:
  fake_site.add_toy("crashy", devices=("CRASHY",), extra=ABORTING_PROBE.format(devices=("CRASHY",)))
  dev = _Device(fake_site.registry(), dev="CRASHY")
  with pytest.raises(DeviceError, match=r"device CRASHY \(backend crashy \(ember-backend-crashy 1.0.0\)\) is "
                                        r"unavailable: ember_probe\('CRASHY'\) of backend crashy .* killed the probe "
                                        r"process with SIGABRT.*EMBER_DISABLE_BACKENDS=crashy"):
    dev["CRASHY"]
  assert dev.DEFAULT == "CRASHY"  # DEV selects it; only opening it fails

def test_crash_is_pinned_on_the_probe_that_crashed(fake_site, probe_process: str) -> None:
  fake_site.add_toy("toy")
  fake_site.add_toy("evil", devices=("EVIL",), extra=ABORTING_PROBE.format(devices=("TOY", "EVIL")))
  with pytest.raises(DeviceError, match=r"device TOY \(backend toy .*of backend evil .*SIGABRT"):
    _Device(fake_site.registry(), dev="TOY")["TOY"]

def test_default_scan_skips_an_aborting_probe(fake_site, probe_process: str) -> None:
  fake_site.add_toy("crashy", devices=("CRASHY",), priority=500, extra=ABORTING_PROBE.format(devices=("CRASHY",)))
  fake_site.add_toy("toy", priority=100)
  dev = _Device(fake_site.registry(deny="core"), dev="")
  assert dev.DEFAULT == "TOY" and dev["TOY"].device == "TOY"

def test_hanging_probe_times_out(fake_site, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(registry_module, "PROBE_TIMEOUT_S", 1.0)
  fake_site.add_toy("slow", devices=("SLOW",), extra="\n@hookimpl\ndef ember_probe(device):\n  import time\n"
                                                     "  time.sleep(600)\n")
  with pytest.raises(DeviceError, match=r"ember_probe\('SLOW'\) of backend slow .*did not answer within 1s"):
    _Device(fake_site.registry(), dev="SLOW")["SLOW"]

def test_probe_runs_once_per_device_and_selection(fake_site, tmp_path, probe_process: str) -> None:
  calls = tmp_path / "calls"
  fake_site.add_toy("toy", devices=("TOY", "TWO"), extra=COUNTING_PROBE.format(path=str(calls)))
  registry = fake_site.registry(deny="core")
  dev = _Device(registry, dev="")
  assert dev.DEFAULT == "TOY" and dev["TOY"].device == "TOY" and dev["TOY:1"].device == "TOY:1"
  assert registry.probe("TOY").reason == "counted" and dev["TWO"].device == "TWO"
  assert calls.read_text().split() == ["TOY", "TWO"]

def test_e2e_dev_selecting_an_aborting_backend_raises(fake_site) -> None:
  fake_site.add_toy("crashy", devices=("CRASHY",), extra=ABORTING_PROBE.format(devices=("CRASHY",)))
  code = ("from ember.device import Device\nfrom ember.errors import DeviceError\n"
          "try: Device[Device.DEFAULT]\nexcept DeviceError as e: print('DeviceError:', e)")
  out = fake_site.run(code, DEV="CRASHY")
  assert out.returncode == 0, out.stderr  # before: the interpreter died with SIGABRT (-6)
  assert "DeviceError: device CRASHY (backend crashy" in out.stdout and "SIGABRT" in out.stdout

def test_factory_errors_name_the_backend(fake_site) -> None:
  fake_site.add_toy("toy", extra="\ndef make_device(device, renderer, compiler): raise OSError('cannot map BAR0')\n")
  with pytest.raises(DeviceError, match=r"opening device TOY \(backend toy \(ember-backend-toy 1.0.0\)\) failed.*BAR0"):
    _Device(fake_site.registry(), dev="")["TOY"]

def test_factory_must_return_compiled(fake_site) -> None:
  fake_site.add_toy("toy", extra="\ndef make_device(device, renderer, compiler): return object()\n")
  with pytest.raises(PluginError, match="not an ember.plugin.Compiled"): _Device(fake_site.registry(), dev="")["TOY"]

def test_unknown_device_lists_available(fake_site) -> None:
  fake_site.add_toy("toy")
  with pytest.raises(DeviceError, match=r"unknown device 'NOPE'; available devices: .*TOY"):
    _Device(fake_site.registry(strict=True), dev="")["NOPE"]

# ** end to end: dist-info installed on sys.path, fresh processes, the real global Device **

def _install_zoo(site) -> None:
  site.add("broken", BROKEN)
  site.add_toy("future", devices=("FUT",), api_version="999")
  site.add_toy("dupa", devices=("DUP",), dist="dist-a")
  site.add_toy("dupb", devices=("DUP",), dist="dist-b", version="2.0")
  site.add_toy("toy", devices=("TOY",), priority=1000)

def test_e2e_import_is_cheap(fake_site) -> None:
  _install_zoo(fake_site)
  out = fake_site.run("import sys, ember\nfrom ember.device import Device\n"
                      "assert Device._registry is None\n"
                      "assert not [m for m in sys.modules if '_plugin_' in m], 'import ember imported a plugin'\n"
                      "print('ok')")
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

def test_e2e_entry_points_are_discovered(fake_site) -> None:
  _install_zoo(fake_site)
  code = ("import json, warnings\nwarnings.simplefilter('ignore')\nfrom ember.device import Device\n"
          "print(json.dumps({b.name: [b.distribution, b.version, b.status] for b in Device.backends()}))")
  out = fake_site.run(code)
  assert out.returncode == 0, out.stderr
  status = json.loads(out.stdout)
  assert status["broken"] == ["ember-backend-broken", "1.0.0", "failed"]
  assert status["future"] == ["ember-backend-future", "1.0.0", "incompatible"]
  assert status["dupa"] == ["dist-a", "1.0.0", "ok"] and status["dupb"] == ["dist-b", "2.0", "ok"]
  assert status["toy"] == ["ember-backend-toy", "1.0.0", "ok"] and status["core"][2] == "ok"

def test_e2e_broken_backends_do_not_break_ember(fake_site) -> None:
  _install_zoo(fake_site)
  out = fake_site.run("from ember.device import Device\nprint(Device.DEFAULT, Device[Device.DEFAULT].device)")
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["TOY", "TOY"]
  assert "PluginWarning" in out.stderr and "libbroken.so" in out.stderr and "plugin API version 999" in out.stderr
  assert "device DUP is registered by 2 backends" in out.stderr

def test_e2e_dev_python_still_works(fake_site) -> None:
  pytest.importorskip("ember.device.python")
  _install_zoo(fake_site)
  code = "from ember.device import Device\nd = Device[Device.DEFAULT]\nprint(Device.DEFAULT, type(d).__name__)"
  out = fake_site.run(code, DEV="PYTHON")
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["PYTHON", "PythonDevice"]

def test_e2e_requested_broken_device(fake_site) -> None:
  _install_zoo(fake_site)
  code = ("import sys\nfrom ember.device import Device\nfrom ember.errors import PluginError\n"
          "try: Device[sys.argv[1]]\nexcept PluginError as e: print(e)\nelse: print('opened')")
  assert "libbroken.so" in fake_site.run(code, "BROKEN").stdout
  assert "plugin API version 999" in fake_site.run(code, "FUTURE").stdout
  assert "dist-a 1.0.0" in (dup := fake_site.run(code, "DUP").stdout) and "dist-b 2.0" in dup

def test_e2e_strict_and_env_lists(fake_site) -> None:
  _install_zoo(fake_site)
  code = "from ember.device import Device\nprint(Device['TOY'].device)"
  strict = fake_site.run(code, EMBER_STRICT_BACKENDS="1")
  assert strict.returncode != 0 and "PluginError" in strict.stderr and "EMBER_STRICT_BACKENDS=1" in strict.stderr
  allowed = fake_site.run(code, EMBER_STRICT_BACKENDS="1", EMBER_BACKENDS="toy")
  assert allowed.returncode == 0 and allowed.stdout.strip() == "TOY", allowed.stderr
  denied = fake_site.run(code, EMBER_STRICT_BACKENDS="1", EMBER_DISABLE_BACKENDS="broken,future,dupb")
  assert denied.returncode == 0 and denied.stdout.strip() == "TOY" and "Warning" not in denied.stderr, denied.stderr
  off = fake_site.run(code, EMBER_DISABLE_BACKENDS="toy")
  assert off.returncode != 0 and "disabled by EMBER_DISABLE_BACKENDS=toy" in off.stderr

def test_e2e_ember_plugins_env(fake_site) -> None:
  module = fake_site.add_toy("toy", devices=("TOY",), priority=1000)
  (fake_site.root / "ember_backend_toy-1.0.0.dist-info" / "entry_points.txt").unlink()  # a source checkout: no metadata
  code = "from ember.device import Device\nprint(Device['TOY'].device, [b.distribution for b in Device.backends()])"
  missing = fake_site.run(code, EMBER_STRICT_BACKENDS="1")
  assert missing.returncode != 0 and "unknown device 'TOY'" in missing.stderr
  found = fake_site.run(code, EMBER_STRICT_BACKENDS="1", EMBER_PLUGINS=f"toy={module}")
  assert found.returncode == 0 and found.stdout.split()[0] == "TOY" and "EMBER_PLUGINS" in found.stdout, found.stderr
  bad = fake_site.run(code, EMBER_PLUGINS="toy")
  assert bad.returncode != 0 and "cannot parse EMBER_PLUGINS item 'toy'" in bad.stderr

def test_ember_plugins_replaces_installed_entry_point(fake_site) -> None:
  fake_site.add_toy("toy", devices=("TOY",))
  other = fake_site.add("alt", "from ember.plugin import *\n")
  registry = fake_site.registry(strict=True, plugins=f"toy={fake_site.sources[0].value}, alt2={other}")
  with pytest.raises(PluginError, match="alt2.*does not implement the required hook ember_backend_info"):
    registry.load()
  names = [(r.name, r.source.distribution) for r in registry.backends]
  assert names == [("core", "ember-core"), ("alt", "ember-backend-alt"), ("toy", "EMBER_PLUGINS"),
                   ("alt2", "EMBER_PLUGINS")]

def test_a_probe_process_slow_to_start_is_not_a_hung_probe() -> None:
  # the probe's own timeout counts from its "calling" line: before it, the process is loading backends (a fresh
  # interpreter on a loaded machine took over the 1 s the hanging-probe test allows its probe)
  calling = '{"calling": "slow (ember-backend-slow 1.0.0)", "name": "slow"}\n'
  started = registry_module._probe_answer("SLOW", calling, -9, True).reason
  assert "ember_probe('SLOW') of backend slow" in started and f"within {registry_module.PROBE_TIMEOUT_S:g}s" in started
  loading = registry_module._probe_answer("SLOW", "", -9, True).reason
  assert f"start probing within {registry_module.PROBE_START_TIMEOUT_S:g}s" in loading
  assert registry_module.PROBE_START_TIMEOUT_S >= 60
