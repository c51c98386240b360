"""An OpenAI-compatible HTTP server on localhost, standard library only: `ember-llm --serve [--port P]`.

  GET  /v1/models             the one loaded model
  POST /v1/completions        {"prompt": str, "max_tokens": 16, "temperature", "top_p", "top_k", "seed", "stream"}
  POST /v1/chat/completions   {"messages": [{"role", "content"}], "max_tokens", ...} rendered with the chat template

With `"stream": true` the reply is server-sent events: one `data: {chunk}` per token, then `data: [DONE]`.
Bad requests get a 4xx JSON body {"error": {"message", "type", "param", "code"}}: malformed JSON, missing or
mistyped fields, an unknown model (404), a prompt that does not fit the context (400, context_length_exceeded).

Concurrency: every request runs in its own thread and holds one of `slots` KV caches (a request slot) for its whole
generation, so concurrent conversations never share a cache; requests beyond the slots wait for a free one. The
model's forward passes are serialised by one lock (ember's scheduler and the captured steps are not re-entrant), so
concurrent requests interleave token by token. Every slot reuses the model's captured decode and prefill steps.
"""
from __future__ import annotations
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
import numpy as np
from ember.errors import EmberError
from ember.nn.llm.generate import SamplingParams, generate
from ember.nn.llm.model import Llama, LlamaSession
from ember.nn.llm.tokenizer import BPETokenizer, render_chatml

log = logging.getLogger("ember.nn.llm.server")
MAX_BODY_BYTES = 1 << 20
DEFAULT_COMPLETION_TOKENS = 16  # as the OpenAI completions API; chat replies default to the rest of the context

class RequestError(EmberError, ValueError):
  """A request the server rejects with an HTTP 4xx JSON error."""
  def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.param, self.code = status, param, code

@dataclass(frozen=True)
class Job:
  """A validated request: the prompt's token ids, how many tokens to generate, sampling, streaming."""
  kind: str  # "chat" or "completion"
  prompt_ids: list[int]
  max_tokens: int
  params: SamplingParams
  stream: bool

class _LockedSession:
  """A cache slot whose forward passes take the model lock: what `generate` drives for one request."""
  def __init__(self, session: LlamaSession, lock: threading.Lock):
    self.session, self.lock, self.max_context = session, lock, session.max_context
  @property
  def pos(self) -> int: return self.session.pos
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
    with self.lock: return self.session.forward(tokens)

class LLMService:
  """The model, tokenizer and request slots behind the HTTP handler; usable without HTTP (`complete`)."""
  def __init__(self, model: Llama, tokenizer: BPETokenizer, chat_template: str | None, model_id: str, slots: int = 2):
    if slots < 1: raise RequestError(f"the server needs at least one request slot, got {slots}")
    self.model, self.tokenizer, self.chat_template, self.model_id = model, tokenizer, chat_template, model_id
    self.lock = threading.Lock()
    self.slots: queue.Queue[LlamaSession] = queue.Queue()
    for _ in range(slots): self.slots.put(LlamaSession(model))
    self.created = int(time.time())

  def parse(self, kind: str, body: Any) -> Job:
    """Validate a request body (already JSON-decoded) into a Job, or raise RequestError."""
    if not isinstance(body, dict): raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != self.model_id:
      raise RequestError(f"model {model!r} does not exist; this server serves {self.model_id!r}", 404, "model",
                         "model_not_found")
    if kind == "chat":
      messages = body.get("messages")
      if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' is required: a non-empty list of {\"role\", \"content\"} objects",
                           param="messages")
      for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
          raise RequestError(f"messages[{i}] must be an object with string 'role' and 'content'", param="messages")
      prompt = render_chatml(self.chat_template, [{"role": m["role"], "content": m["content"]} for m in messages])
    else:
      given = body.get("prompt")
      if isinstance(given, list) and len(given) == 1: given = given[0]
      if not isinstance(given, str): raise RequestError("'prompt' is required: a string", param="prompt")
      prompt = given
    ids = self.tokenizer.encode(prompt)
    if not ids: raise RequestError("the prompt encodes to no tokens", param="prompt")
    room = self.model.max_context - len(ids)
    if room <= 0:
      raise RequestError(f"the prompt is {len(ids)} tokens but the context holds {self.model.max_context}; shorten "
                         f"it", param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
    default = room if kind == "chat" else min(DEFAULT_COMPLETION_TOKENS, room)
    max_tokens = _field(body, "max_completion_tokens", int, _field(body, "max_tokens", int, default))
    if max_tokens < 1: raise RequestError(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    if max_tokens > room:
      raise RequestError(f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the context of "
                         f"{self.model.max_context} tokens; lower max_tokens to {room} or less", param="max_tokens",
                         code="context_length_exceeded")
    temperature = _field(body, "temperature", float, 1.0)
    try:
      params = SamplingParams(temperature=temperature, top_k=_field(body, "top_k", int, 0),
                              top_p=_field(body, "top_p", float, 1.0), seed=_field(body, "seed", int, None))
    except EmberError as e: raise RequestError(str(e)) from e
    return Job(kind, ids, max_tokens, params, bool(_field(body, "stream", bool, False)))

  def complete(self, job: Job, on_text: Callable[[str], None] | None = None) -> tuple[str, str, int]:
    """Generate for `job` in a free slot: (text, finish_reason "stop"/"length", completion tokens); `on_text`
    receives the text as it is decoded."""
    session = self.slots.get()
    try:
      session.reset()
      decoder = self.tokenizer.stream_decoder()
      pieces: list[str] = []
      def on_token(token_id: int) -> None:
        if token_id in self.tokenizer.stop_ids: return
        piece = decoder.push(token_id)
        if piece:
          pieces.append(piece)
          if on_text is not None: on_text(piece)
      out = generate(_LockedSession(session, self.lock), job.prompt_ids, job.max_tokens, job.params,
                     self.tokenizer.stop_ids, on_token)
      if tail := decoder.flush():
        pieces.append(tail)
        if on_text is not None: on_text(tail)
    finally:
      self.slots.put(session)
    finish = "stop" if out and out[-1] in self.tokenizer.stop_ids else "length"
    return "".join(pieces), finish, len(out)

def _field(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
  value = body.get(key)
  if value is None: return default
  # JSON numbers: an int is a valid float, a bool is not a number, a float is not an int
  ok = isinstance(value, bool) if kind is bool else (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                     and (kind is float or isinstance(value, int)))
  if not ok: raise RequestError(f"'{key}' must be {'an integer' if kind is int else 'a ' + kind.__name__}, got "
                                f"{json.dumps(value)}", param=key)
  return kind(value)

class LLMRequestHandler(BaseHTTPRequestHandler):
  service: LLMService  # set on the per-server subclass by make_server
  protocol_version = "HTTP/1.1"

  def log_message(self, format: str, *args: Any) -> None:
    log.info("%s - %s", self.address_string(), format % args)

  def do_GET(self) -> None:
    if self.path.rstrip("/") == "/v1/models":
      card = {"id": self.service.model_id, "object": "model", "created": self.service.created, "owned_by": "ember"}
      self._json(200, {"object": "list", "data": [card]})
    else: self._error(RequestError(f"no route GET {self.path}; try GET /v1/models", 404, code="not_found"))

  def do_POST(self) -> None:
    routes = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
    kind = routes.get(self.path.rstrip("/"))
    try:
      body = self._body()
      if kind is None: raise RequestError(f"no route POST {self.path}; try {' or '.join(routes)}", 404,
                                          code="not_found")
      job = self.service.parse(kind, body)
    except RequestError as e:
      self._error(e)
      return
    try:
      self._stream(job) if job.stream else self._reply(job)
    except (BrokenPipeError, ConnectionResetError):
      log.info("client went away during a %s request", kind)
    except EmberError as e:
      log.exception("generation failed")
      self._error(RequestError(f"generation failed: {e}", 500, code="server_error"))

  def _body(self) -> Any:
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit(): raise RequestError("a JSON body with a Content-Length is required",
                                                                  411)
    if int(length) > MAX_BODY_BYTES:
      raise RequestError(f"the body is {length} bytes; at most {MAX_BODY_BYTES} are accepted", 413)
    raw = self.rfile.read(int(length))
    try: return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise RequestError(f"the body is not valid JSON: {e}", code="invalid_json") from e

  def _reply(self, job: Job) -> None:
    text, finish, n = self.service.complete(job)
    usage = {"prompt_tokens": len(job.prompt_ids), "completion_tokens": n, "total_tokens": len(job.prompt_ids) + n}
    if job.kind == "chat":
      choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    else: choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    self._json(200, {**self._envelope(job, chunk=False), "choices": [choice], "usage": usage})

  def _stream(self, job: Job) -> None:
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.send_header("Connection", "close")  # the stream ends when the connection does (no Content-Length)
    self.end_headers()
    self.close_connection = True
    envelope = self._envelope(job, chunk=True)
    def event(payload: Any) -> None:
      self.wfile.write(f"data: {json.dumps(payload) if not isinstance(payload, str) else payload}\n\n".encode())
      self.wfile.flush()
    def choice(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
      if job.kind == "completion": return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
      delta: dict[str, str] = {"role": "assistant"} if role else {}
      if text is not None: delta["content"] = text
      return {"index": 0, "delta": delta, "finish_reason": finish}
    if job.kind == "chat": event({**envelope, "choices": [choice(None, None, role=True)]})
    _, finish, _ = self.service.complete(job, lambda text: event({**envelope, "choices": [choice(text, None)]}))
    event({**envelope, "choices": [choice(None if job.kind == "chat" else "", finish)]})
    event("[DONE]")

  def _envelope(self, job: Job, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.kind == "chat" else "text_completion"
    prefix = "chatcmpl" if job.kind == "chat" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": self.service.model_id}

  def _json(self, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _error(self, e: RequestError) -> None:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    self.close_connection = True  # an unread or partly read body must not be taken for the next request
    self._json(e.status, {"error": {"message": str(e), "type": kind, "param": e.param, "code": e.code}})

def make_server(service: LLMService, port: int = 8000, host: str = "127.0.0.1") -> ThreadingHTTPServer:
  """A threading HTTP server bound to host:port (port 0 picks a free one: `server.server_address[1]`); call
  `serve_forever()` on it, `shutdown()` from another thread to stop."""
  handler = type("BoundLLMRequestHandler", (LLMRequestHandler,), {"service": service})
  server = ThreadingHTTPServer((host, port), handler)
  server.daemon_threads = True
  return server
