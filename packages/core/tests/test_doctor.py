"""`python -m ember devices`: the doctor reports every backend, probes each in a subprocess, never crashes itself."""
from __future__ import annotations
import json
from typing import Any

BROKEN = "raise ImportError('libbroken.so: cannot open shared object file')\n"
CRASHING_PROBE = '''
import os
@hookimpl
def ember_probe(device):
  if device == "CRASHY": os._exit(86)  # a native library taking the process down (no core dump)
  return None
'''
NO_HARDWARE = '''
@hookimpl
def ember_probe(device):
  return ProbeResult(False, "no gone hardware here") if device == "GONE" else None
'''
FAILING_RENDERER = '''
@hookimpl
def ember_register_renderers(registry):
  def fails(arch): raise OSError("libfancy.so not found")
  registry.add("TOY", "FANCY", fails, priority=5)
  registry.add("TOY", "TC", lambda arch: ToyRenderer("TC", arch))
'''

def _doctor(site: Any, *args: str, **env: str) -> tuple[int, Any]:
  out = site.run("", "-m", "ember", "devices", *args, **env)
  assert out.stdout, out.stderr
  return out.returncode, json.loads(out.stdout) if "--json" in args else out.stdout

def _by_name(report: dict[str, Any]) -> dict[str, Any]: return {b["name"]: b for b in report["backends"]}

def test_doctor_reports_every_kind_of_backend(fake_site) -> None:
  fake_site.add("broken", BROKEN)
  fake_site.add_toy("future", devices=("FUT",), api_version="999")
  fake_site.add_toy("dupa", devices=("DUP",), dist="dist-a")
  fake_site.add_toy("dupb", devices=("DUP",), dist="dist-b", version="2.0")
  fake_site.add_toy("crashy", devices=("CRASHY",), extra=CRASHING_PROBE)
  fake_site.add_toy("gone", devices=("GONE",), priority=2000, extra=NO_HARDWARE)
  fake_site.add_toy("toy", devices=("TOY",), priority=1000, interfaces=("PCI", "MOCK"), extra=FAILING_RENDERER)
  rc, report = _doctor(fake_site, "--json", EMBER_STRICT_BACKENDS="1")  # the doctor reports, strict or not
  assert rc == 1  # failed / incompatible / conflicting backends make the exit status non-zero
  backends = _by_name(report)
  core = backends["core"]
  assert (core["distribution"], core["status"], core["builtin"]) == ("ember-core", "ok", True)
  assert {d["name"] for d in core["devices"]} == {"PYTHON", "NULL", "DISK"}
  disk = next(d for d in core["devices"] if d["name"] == "DISK")
  assert disk["renderers"] == [] and disk["ok"]
  python = next(d for d in core["devices"] if d["name"] == "PYTHON")
  assert [r["dev"] for r in python["renderers"]] == ["DEV=PYTHON:PYTHON"]
  assert backends["broken"]["status"] == "failed" and "libbroken.so" in backends["broken"]["reason"]
  assert backends["future"]["status"] == "incompatible" and "plugin API version 999" in backends["future"]["reason"]
  assert backends["crashy"]["status"] == "failed" and "probe process exited" in backends["crashy"]["reason"]
  assert backends["gone"]["status"] == "unavailable" and "no gone hardware here" in backends["gone"]["reason"]
  toy = backends["toy"]
  assert (toy["distribution"], toy["version"], toy["status"]) == ("ember-backend-toy", "1.0.0", "ok")
  device = toy["devices"][0]
  assert device["interfaces"] == ["PCI", "MOCK"] and device["dev"] == ["DEV=TOY", "DEV=PCI+TOY", "DEV=MOCK+TOY"]
  renderers = {r["name"]: r for r in device["renderers"]}
  assert renderers["TC"]["ok"] and renderers["TC"]["dev"] == "DEV=TOY:TC"
  assert not renderers["FANCY"]["ok"] and "libfancy.so not found" in renderers["FANCY"]["reason"]
  assert report["default"] == "TOY"  # GONE has a higher priority but its probe says no
  assert any("DUP" in c and "dist-a 1.0.0" in c and "dist-b 2.0" in c for c in report["conflicts"])
  assert all(d["conflict"] for name in ("dupa", "dupb") for d in backends[name]["devices"])

def test_doctor_text_and_exit_status(fake_site) -> None:
  fake_site.add_toy("toy", devices=("TOY",), renderers=("TC", "TL"))
  rc, text = _doctor(fake_site, DEV="TOY:TL")
  assert rc == 0
  lines = text.splitlines()
  assert any(line.startswith("toy") and "ember-backend-toy 1.0.0" in line and line.endswith("ok") for line in lines)
  assert any("DEV=TOY:TL" in line for line in lines) and any("DEV=PYTHON:PYTHON" in line for line in lines)
  assert "DEV=TOY:TL; default device: TOY:TL" in text

def test_doctor_respects_disable_list(fake_site) -> None:
  fake_site.add("broken", BROKEN)
  rc, report = _doctor(fake_site, "--json", EMBER_DISABLE_BACKENDS="broken")
  assert rc == 0
  assert _by_name(report)["broken"]["status"] == "disabled"

def test_probe_subcommand(fake_site) -> None:
  fake_site.add_toy("gone", devices=("GONE",), extra=NO_HARDWARE)
  rc, result = _doctor(fake_site, "--probe", "gone", "--json")
  assert rc == 0
  renderers = {"TC": {"ok": True, "reason": ""}}
  assert result["devices"]["GONE"] == {"ok": False, "reason": "no gone hardware here", "renderers": renderers,
                                       "interfaces": {}}

PCI_NEEDS_A_CARD = '''
from ember.plugin import device_target
@hookimpl
def ember_probe(device):
  if device != "TOY": return None
  iface = device_target(device).interface
  return ProbeResult(iface == "MOCK", "" if iface == "MOCK" else f"no PCI card for interface {iface or 'PCI'!r}")
'''

def test_each_interface_is_probed_as_dev_would_select_it(fake_site) -> None:
  fake_site.add_toy("toy", devices=("TOY",), interfaces=("PCI", "MOCK"), extra=PCI_NEEDS_A_CARD)
  rc, report = _doctor(fake_site, "--json")
  device = _by_name(report)["toy"]["devices"][0]
  probes = {i["name"]: i for i in device["interface_probes"]}
  assert probes["MOCK"]["ok"] and probes["MOCK"]["dev"] == "DEV=MOCK+TOY"
  assert probes["MOCK"]["reason"].startswith("opened with renderer ")  # opened as DEV=MOCK+TOY would open it
  assert not probes["PCI"]["ok"] and "no PCI card for interface 'PCI'" in probes["PCI"]["reason"]
  rc, text = _doctor(fake_site)
  assert any("interface MOCK" in line and line.endswith("ok (opened with renderer ToyRenderer, compiler ToyCompiler)")
             for line in text.splitlines()), text
  assert any("interface PCI" in line and "unavailable: no PCI card" in line for line in text.splitlines())
