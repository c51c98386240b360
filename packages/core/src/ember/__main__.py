"""The doctor: ``python -m ember devices [--json]`` lists every installed backend and whether it works here.

For each backend (core's builtin one included): distribution and version, status (ok / unavailable / incompatible /
failed / disabled, with the reason), and for each of its devices the interfaces, the renderers and the ``DEV=``
string that selects each. Every backend is probed in its own subprocess (``python -m ember devices --probe NAME
--json``) so a native library that crashes cannot take the report down. Exit status 1 when a backend is failed or
incompatible or two backends conflict, else 0.
"""
from __future__ import annotations
import argparse
import json
import os
import subprocess
import sys
import warnings
from dataclasses import asdict
from typing import Any

PROBE_TIMEOUT_S = 120.0

def _registry() -> Any:
  from ember.device.registry import BackendRegistry
  return BackendRegistry.from_env(strict=False)  # the doctor reports problems instead of raising on them

def _failure(e: BaseException) -> dict[str, Any]: return {"ok": False, "reason": f"{type(e).__name__}: {e}"}

def _open_device(name: str, reason: str) -> dict[str, Any]:
  """Open device ``name`` as the current DEV selection would: the renderer, compiler and device object a program gets,
  so an interface whose compiler cannot load (say, one that needs a library the interface does not use) is reported
  here, not at the first kernel. ``reason`` (the probe's) is kept, with what was opened."""
  from ember.device.registry import Device
  try: dev = Device._open_canonical(Device.canonicalize(name))
  except Exception as e: return _failure(e)  # noqa: BLE001  the failure is the report
  used = f"renderer {type(dev.renderer).__name__}, compiler {type(dev.compiler).__name__}"
  dev.finalize()
  return {"ok": True, "reason": f"{reason}; opened with {used}" if reason else f"opened with {used}"}

def probe_backend(name: str) -> dict[str, Any]:
  """Probe every device of backend ``name`` and try to build each of its renderers and compilers (run in a child)."""
  from ember.device.registry import Device
  from ember.plugin import PluginWarning
  registry = _registry()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    registry.load()
  rec = registry.record(name)
  devices: dict[str, Any] = {}
  for entry in rec.devices:
    probe = registry.probe_here(entry.name)  # this process is the isolation: the doctor runs it as a child
    arch = Device.get_target(entry.name).arch
    renderers: dict[str, Any] = {}
    for rend in registry.renderer_entries(entry.name):
      try:
        renderer = rend.factory(arch)
        comp = registry.compilers.get((entry.name, rend.name))
        if comp: comp[0].factory(renderer)
        renderers[rend.name] = {"ok": True, "reason": ""}
      except Exception as e:  # noqa: BLE001  the failure is the report
        renderers[rend.name] = _failure(e)
    interfaces: dict[str, Any] = {}
    for iface in entry.interfaces:  # each as DEV=<interface>+<device> would select it
      saved = (Device._dev, Device._default)
      Device.DEFAULT = f"{iface}+{entry.name}"
      try:
        iprobe = registry.probe_here(entry.name)
        interfaces[iface] = _open_device(entry.name, iprobe.reason) if iprobe.ok else \
          {"ok": False, "reason": iprobe.reason}
      finally: Device._dev, Device._default = saved
    devices[entry.name] = {"ok": probe.ok, "reason": probe.reason, "renderers": renderers, "interfaces": interfaces}
  return {"backend": name, "status": rec.status, "reason": rec.reason, "devices": devices}

def _child_env() -> dict[str, str]:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the child must see what this process sees
  env["EMBER_STRICT_BACKENDS"] = "0"
  return env

def _run_probes(names: list[str]) -> dict[str, dict[str, Any]]:
  """One subprocess per backend, all started at once; a crash or hang becomes that backend's reason."""
  env = _child_env()
  procs = {n: subprocess.Popen([sys.executable, "-m", "ember", "devices", "--probe", n, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for n in names}
  results: dict[str, dict[str, Any]] = {}
  for name, proc in procs.items():
    try: out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.communicate()
      results[name] = {"crashed": f"the probe did not finish within {PROBE_TIMEOUT_S:.0f}s"}
      continue
    if proc.returncode != 0:
      tail = " | ".join(err.strip().splitlines()[-3:])
      results[name] = {"crashed": f"the probe process exited with code {proc.returncode}: {tail}"}
      continue
    try: results[name] = json.loads(out)
    except json.JSONDecodeError as e:
      results[name] = {"crashed": f"the probe printed invalid JSON ({e}): {out[:200]!r}"}
  return results

def collect() -> dict[str, Any]:
  """The whole report as a JSON-able dict."""
  from ember import __version__
  from ember.helpers import getenv
  from ember.plugin import PLUGIN_API_VERSION, PluginWarning
  registry = _registry()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    reports = registry.report()
  probes = _run_probes([r.name for r in reports if r.status == "ok"])
  backends = []
  usable: set[str] = set()
  for rep in reports:
    data = asdict(rep)
    status, reason = rep.status, rep.reason
    probe = probes.get(rep.name, {})
    if "crashed" in probe: status, reason = "failed", probe["crashed"]
    devices = []
    for dev in rep.devices:
      dprobe = probe.get("devices", {}).get(dev.name, {"ok": status == "ok", "reason": reason})
      unknown = {"ok": False, "reason": reason}
      rprobes = dprobe.get("renderers", {})
      renderers = [{"name": r, "dev": f"DEV={dev.name}:{r}", **rprobes.get(r, unknown)} for r in dev.renderers]
      ok, why = dprobe["ok"], dprobe["reason"]
      if ok and renderers and not any(r["ok"] for r in renderers):
        ok, why = False, "no renderer builds: " + "; ".join(f"{r['name']}: {r['reason']}" for r in renderers)
      if ok and not dev.conflict: usable.add(dev.name)
      iprobes = dprobe.get("interfaces", {})
      interfaces = [{"name": i, "dev": f"DEV={i}+{dev.name}", **iprobes.get(i, unknown)} for i in dev.interfaces]
      devices.append({**asdict(dev), "ok": ok, "reason": why, "renderers": renderers, "interface_probes": interfaces,
                      "dev": [f"DEV={dev.name}"] + [f"DEV={i}+{dev.name}" for i in dev.interfaces]})
    if status == "ok" and devices and not any(d["ok"] for d in devices):
      status, reason = "unavailable", "; ".join(f"{d['name']}: {d['reason']}" for d in devices)
    backends.append({**data, "status": status, "reason": reason, "devices": devices})
  dev_env = getenv("DEV", "")
  default = dev_env or next((e.name for e in registry.auto_candidates() if e.name in usable), "")
  return {"ember": __version__, "plugin_api": PLUGIN_API_VERSION, "python": sys.executable, "dev": dev_env,
          "default": default, "backends": backends, "conflicts": list(registry.conflicts.values())}

def format_report(report: dict[str, Any]) -> str:
  lines = [f"ember {report['ember']} (plugin API {report['plugin_api']}) on {report['python']}",
           f"DEV={report['dev'] or '<unset>'}; default device: {report['default'] or 'none'}", ""]
  for b in report["backends"]:
    kind = ", built into ember-core" if b["builtin"] else ""
    head = f"{b['name']}  ({b['distribution']} {b['version']}{kind})  {b['status']}"
    lines.append(head + (f": {b['reason']}" if b["reason"] and b["status"] != "unavailable" else ""))
    if b["description"]: lines.append(f"    {b['description']}")
    for d in b["devices"]:
      state = "ok" if d["ok"] else f"unavailable: {d['reason']}"
      ifaces = ", ".join(d["interfaces"]) or "-"
      lines.append(f"  {d['name']:<8} priority {d['priority']:>4}  interfaces: {ifaces}  {state}")
      if d["conflict"]: lines.append(f"    CONFLICT: {d['conflict']}")
      for i in d["interface_probes"]:
        istate = (f"ok ({i['reason']})" if i["reason"] else "ok") if i["ok"] else f"unavailable: {i['reason']}"
        lines.append(f"    interface {i['name']:<8} {i['dev']:<20} {istate}")
      for r in d["renderers"]:
        rstate = "ok" if r["ok"] else f"unavailable: {r['reason']}"
        lines.append(f"    renderer  {r['name']:<8} {r['dev']:<20} {rstate}")
      if not d["renderers"]: lines.append("    (no renderer: holds buffers, runs no kernels)")
  if report["conflicts"]:
    lines += ["", "conflicts:"] + [f"  {c}" for c in report["conflicts"]]
  return "\n".join(lines)

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m ember", description="ember tools")
  sub = parser.add_subparsers(dest="command", required=True)
  devices = sub.add_parser("devices", help="list installed backends, their devices, renderers and DEV= strings")
  devices.add_argument("--json", action="store_true", help="print machine-readable JSON")
  devices.add_argument("--probe", metavar="BACKEND",
                       help="probe one backend in this process (the doctor runs this in a subprocess)")
  args = parser.parse_args(argv)
  if args.probe:
    result = probe_backend(args.probe.strip().lower())
    sys.stdout.write(json.dumps(result) + "\n" if args.json else json.dumps(result, indent=2) + "\n")
    return 0
  report = collect()
  sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else format_report(report) + "\n")
  broken = any(b["status"] in ("failed", "incompatible") for b in report["backends"])
  return 1 if broken or report["conflicts"] else 0

if __name__ == "__main__":
  sys.exit(main())
