"""The VIZ web server: the page (static/, package data) and a small JSON API over one exported trace.

  GET /                      the page (static/index.html, viz.js, viz.css)
  GET /api/trace             kernels (name, device, opts, time, AST, linear program, source) with their passes'
                             names and counts, the rule table, the profiler timeline; no graphs
  GET /api/rewrite?kernel=K&rewrite=R
                             pass R of kernel K: its nodes and, per step, the graph's sink, the rule and the nodes
                             matched and returned

Only 127.0.0.1 is bound; the page loads nothing from elsewhere (its Content-Security-Policy forbids it).
"""
from __future__ import annotations
import errno
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit
from ember.errors import VizError
from ember.helpers import VIZ_PORT
from ember.viz.record import Recorder

DEFAULT_PORT = 8000
STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/viz.js": ("viz.js", "text/javascript; charset=utf-8"),
          "/viz.css": ("viz.css", "text/css; charset=utf-8")}
HEADERS = {
  "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                             "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}

class SavedTrace:
  """A trace exported with every pass's graphs (`VIZ=file.json`, `ember.viz.load`)."""
  def __init__(self, data: dict[str, Any]):
    self.data = data
    kernels = [{**kernel, "rewrites": [{k: v for k, v in r.items() if k not in ("nodes", "steps")}
                                        for r in kernel["rewrites"]]} for kernel in data["kernels"]]
    self._summary = {**data, "kernels": kernels}
  def summary(self) -> dict[str, Any]: return self._summary
  def detail(self, kernel: int, rewrite: int) -> dict[str, Any]:
    return self.data["kernels"][kernel]["rewrites"][rewrite]

class LiveTrace:
  """The running program's recorder: its passes' graphs are rebuilt when the page first asks for them."""
  def __init__(self, recorder: Recorder, timeline: list[dict[str, Any]] | None = None):
    self.recorder = recorder
    self._summary = recorder.export(details=False, timeline=timeline)
    self._details: dict[tuple[int, int], dict[str, Any]] = {}
    self._lock = threading.Lock()
  def summary(self) -> dict[str, Any]: return self._summary
  def detail(self, kernel: int, rewrite: int) -> dict[str, Any]:
    with self._lock:  # the server answers on several threads; each pass is rebuilt once
      if (kernel, rewrite) not in self._details:
        self._details[(kernel, rewrite)] = self.recorder.export_rewrite(self.recorder.kernels[kernel].rewrites[rewrite])
      return self._details[(kernel, rewrite)]

TraceSource = SavedTrace | LiveTrace

def rewrite_detail(source: TraceSource, query: dict[str, list[str]]) -> dict[str, Any]:
  try: k, r = int(query["kernel"][0]), int(query["rewrite"][0])
  except (KeyError, ValueError) as e:
    raise VizError("/api/rewrite needs integer kernel= and rewrite= query parameters, e.g. ?kernel=0&rewrite=1") from e
  kernels = source.summary()["kernels"]
  if not 0 <= k < len(kernels) or not 0 <= r < len(kernels[k]["rewrites"]):
    raise VizError(f"no pass {r} of kernel {k}: the trace has {len(kernels)} kernels (see /api/trace)")
  return source.detail(k, r)

class VizHandler(BaseHTTPRequestHandler):
  source: TraceSource
  def log_message(self, format: str, *args: Any) -> None: pass  # the page polls nothing; keep the terminal quiet
  def _send(self, code: int, body: bytes, content_type: str) -> None:
    self.send_response(code)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    for k, v in HEADERS.items(): self.send_header(k, v)
    self.end_headers()
    self.wfile.write(body)
  def _json(self, code: int, obj: Any) -> None: self._send(code, json.dumps(obj).encode(), "application/json")
  def do_GET(self) -> None:
    url = urlsplit(self.path)
    if url.path in STATIC:
      name, content_type = STATIC[url.path]
      return self._send(200, resources.files(__package__).joinpath("static", name).read_bytes(), content_type)
    if url.path == "/api/trace": return self._json(200, self.source.summary())
    if url.path == "/api/rewrite":
      try: return self._json(200, rewrite_detail(self.source, parse_qs(url.query)))
      except VizError as e: return self._json(404, {"error": str(e)})
    routes = ", ".join([*STATIC, "/api/trace", "/api/rewrite"])
    self._json(404, {"error": f"no route {url.path}; the routes are {routes}"})

def make_server(source: TraceSource, port: int) -> ThreadingHTTPServer:
  """A server of `source` on 127.0.0.1:`port` (0: any free port); the caller runs serve_forever."""
  handler = type("BoundVizHandler", (VizHandler,), {"source": source})
  try: return ThreadingHTTPServer(("127.0.0.1", port), handler)
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise OSError(e.errno, f"VIZ: port {port} is in use; choose another with VIZ_PORT=<port> (0: any free port)") \
        from e
    raise

def _free(port: int) -> bool:
  with socket.socket() as s:
    try: s.bind(("127.0.0.1", port))
    except OSError: return False
  return True

def pick_port(port: int | None = None) -> int:
  """`port`, else VIZ_PORT when set, else 8000 when free, else any free port."""
  if port is not None: return port
  if VIZ_PORT.value >= 0: return int(VIZ_PORT.value)
  return DEFAULT_PORT if _free(DEFAULT_PORT) else 0
