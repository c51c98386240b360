"""An OpenAI-compatible HTTP server on localhost, standard library only, and a chat page: `ember-llm --serve`.

  GET  /                      the chat page (static/: index.html, chat.js, chat.css, favicon.svg; package data, no
                              third-party code)
  GET  /v1/models             the one loaded model (GET /v1/models/{id}: its card)
  POST /v1/completions        {"prompt": str | [str] | [int] | [[int]], "max_tokens": 16, "temperature", "top_p",
                               "top_k", "seed", "n", "stop", "stream", "stream_options": {"include_usage"},
                               "logprobs": 0..5}
  POST /v1/chat/completions   {"messages": [{"role", "content"}], "max_tokens", ..., "logprobs": bool,
                               "top_logprobs": 0..20} rendered with the chat template

With `"stream": true` the reply is server-sent events: one `data: {chunk}` per piece of text, then `data: [DONE]`;
with `"stream_options": {"include_usage": true}` a last chunk before `[DONE]` carries the usage and no choices.
`n` choices are generated one after the other (streamed one after the other, each chunk naming its `index`); a seeded
request gives choice 0 the request's seed and choice i a seed derived from (seed, i). `stop` strings (up to 4) end a
choice at the first one completed, which is not part of the text; its finish_reason is then "stop".

Log probabilities are those of the model's raw logits (a log-softmax over the vocabulary, before temperature, top-k
and top-p), in OpenAI's shape for each endpoint: completions {"tokens", "token_logprobs", "top_logprobs": [{token:
logprob}], "text_offset"}, chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}. They cover every
generated token except an end-of-turn token, including the one that completed a stop string; a streamed chunk
carries those of the tokens generated since the previous chunk, the finishing chunk the rest.

A client that closes its connection stops the generation of its request: the socket is checked between tokens (the
chat page's stop button aborts its fetch, which closes it).

Every request gets an HTTP reply, never a dropped connection: bad input a 4xx JSON body {"error": {"message", "type",
"param", "code"}} (malformed, too deeply nested or non-UTF-8 JSON, integers of more than 20 digits, NaN/Infinity,
lone surrogates, mistyped or out-of-range fields, an unknown model (404), a prompt that does not fit the context (400,
context_length_exceeded), fields this server does not implement set to non-default values), 404/405 for unknown
routes or methods, 411/413 for a missing or oversized body, 408 when a client stalls longer than the read timeout, and
500 with the traceback logged for a bug; an error after a stream started ends the stream with a `data: {"error": ...}`
event. Unknown fields are ignored, as OpenAI does.

Concurrency: every request runs in its own thread and holds one of `slots` KV caches (a request slot) for its whole
generation, so concurrent conversations never share a cache; requests beyond the slots wait for a free one. The
model's forward passes are serialised by one lock (ember's scheduler and the captured steps are not re-entrant), so
concurrent requests interleave token by token. Every slot reuses the model's captured decode and prefill steps.
"""
from __future__ import annotations
import contextlib
import dataclasses
import json
import logging
import math
import queue
import re
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from importlib import resources
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit
import numpy as np
from ember.errors import EmberError
from ember.nn.llm.generate import SamplingParams, generate
from ember.nn.llm.batch import BatchEngine, BatchSession
from ember.nn.llm.model import Llama, LlamaSession
from ember.nn.llm.progress import ProgressBar, warm_up
from ember.nn.llm.tokenizer import BPETokenizer, render_chat

log = logging.getLogger("ember.nn.llm.server")
MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32       # a request nests 5 deep at most (body, messages, message, content parts, part)
MAX_INT_DIGITS = 20       # enough for any 64-bit integer; longer ones are refused while parsing
MAX_STOP_STRINGS, MAX_STOP_CHARS = 4, 256
MAX_CHOICES = 128         # OpenAI's bound on n
READ_TIMEOUT_S = 30.0     # a connection that sends nothing for this long is answered 408 (mid-body) or closed
DEFAULT_COMPLETION_TOKENS = 16  # as the OpenAI completions API; chat replies default to the rest of the context
CHAT_ROLES = ("system", "developer", "user", "assistant")
# the chat page: route -> (file in the package's static folder, Content-Type)
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
              "/chat.css": ("chat.css", "text/css; charset=utf-8"), "/favicon.svg": ("favicon.svg", "image/svg+xml")}
# the page runs only its own script and style and talks only to this server: no inline code, no other origin
PAGE_HEADERS = {
  "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                             "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
ROUTES = {"/v1/models": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST",
          **{route: "GET" for route in PAGE_FILES}}
MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS = 5, 20  # OpenAI's bounds: completions' `logprobs`, chat's `top_logprobs`

# fields of OpenAI's API that change the reply and that this server does not implement: refused with 400 unless
# absent, null or one of the values that mean "off"
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
  "echo": (False,), "suffix": ("",), "best_of": (1,),
  "logit_bias": ({},), "presence_penalty": (0,), "frequency_penalty": (0,), "tools": ([],), "functions": ([],),
  "response_format": ({"type": "text"},),
}

class RequestError(EmberError, ValueError):
  """A request the server answers with an HTTP error status and an OpenAI-shaped JSON error body."""
  def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
               headers: dict[str, str] | None = None):
    super().__init__(message)
    self.status, self.param, self.code, self.headers = status, param, code, headers or {}

class ClientGoneError(EmberError, ConnectionAbortedError):
  """The client closed its connection while its reply was being generated; generation stopped."""

@dataclass(frozen=True)
class Job:
  """A validated request: the prompt's token ids, how many tokens to generate, sampling, choices, stop strings,
  streaming."""
  kind: str  # "chat" or "completion"
  prompt_ids: list[int]
  max_tokens: int
  params: SamplingParams
  stream: bool
  n: int = 1
  stop: tuple[str, ...] = ()
  include_usage: bool = False
  logprobs: int | None = None  # None: no log probabilities; k: each token's and its k most likely alternatives'

@dataclass(frozen=True)
class TokenLogprob:
  """A generated token's log probability and the `top` most likely tokens at its position as (id, logprob), most
  likely first."""
  token: int
  logprob: float
  top: tuple[tuple[int, float], ...]

@dataclass(frozen=True)
class Choice:
  """One generated choice: its text (stop strings cut off), finish_reason "stop"/"length", tokens generated, and
  (when asked for) the log probabilities of its tokens."""
  text: str
  finish_reason: str
  tokens: int
  logprobs: list[TokenLogprob] = field(default_factory=list)

# ** JSON with bounded nesting and integers **

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENERS, _CLOSERS = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)

def nesting_depth(raw: bytes) -> int:
  """How deep the arrays and objects of the JSON text `raw` nest (brackets inside strings do not count), found
  without recursion so that a hostile body cannot exhaust the parser's stack."""
  bare = np.frombuffer(_JSON_STRING.sub(b"", raw), np.uint8)
  steps = np.isin(bare, _OPENERS).astype(np.int64) - np.isin(bare, _CLOSERS)
  return int(np.cumsum(steps).max(initial=0))

def _parse_int(digits: str) -> int:
  if len(digits.lstrip("-")) > MAX_INT_DIGITS:
    raise RequestError(f"the body holds an integer of {len(digits.lstrip('-'))} digits; at most {MAX_INT_DIGITS} "
                       f"are accepted", code="invalid_json")
  return int(digits)

def _refuse_constant(name: str) -> Any:
  raise RequestError(f"the body is not valid JSON: {name} is not a JSON number; send a finite number",
                     code="invalid_json")

def parse_json(raw: bytes) -> Any:
  """Decode a request body: UTF-8 JSON, nested at most MAX_JSON_DEPTH deep, integers of at most MAX_INT_DIGITS digits,
  no NaN/Infinity; anything else raises RequestError."""
  try: text = raw.decode("utf-8")
  except UnicodeDecodeError as e: raise RequestError(f"the body is not UTF-8: {e}", code="invalid_json") from e
  if (depth := nesting_depth(raw)) > MAX_JSON_DEPTH:
    raise RequestError(f"the body's JSON nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
                       code="invalid_json")
  try: return json.loads(text, parse_int=_parse_int, parse_constant=_refuse_constant)
  except json.JSONDecodeError as e: raise RequestError(f"the body is not valid JSON: {e}", code="invalid_json") from e

# ** fields **

def _describe(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 60 else text[:57] + "..."

def _text(value: Any, param: str) -> str:
  """`value` as a string of valid Unicode (JSON's \\ud800 escapes can produce lone surrogates, which no tokenizer
  can encode)."""
  if not isinstance(value, str): raise RequestError(f"'{param}' must be a string, got {_describe(value)}", param=param)
  try: value.encode("utf-8")
  except UnicodeEncodeError as e:
    raise RequestError(f"'{param}' holds a lone UTF-16 surrogate ({value[e.start]!r}) at character {e.start}; send "
                       f"valid Unicode (surrogates only in high-low pairs)", param=param) from e
  return value

def _int(body: dict[str, Any], key: str, default: Any, low: int, high: int) -> Any:
  value = body.get(key)
  if value is None: return default
  if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
    raise RequestError(f"'{key}' must be an integer in [{low}, {high}], got {_describe(value)}", param=key)
  return value

def _number(body: dict[str, Any], key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
  value = body.get(key)
  if value is None: return default
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or not (low < value if low_open else low <= value) or value > high:
    raise RequestError(f"'{key}' must be a finite number in {'(' if low_open else '['}{low:g}, {high:g}], got "
                       f"{_describe(value)}", param=key)
  return float(value)

def _bool(body: dict[str, Any], key: str) -> bool:
  value = body.get(key)
  if value is None: return False
  if not isinstance(value, bool): raise RequestError(f"'{key}' must be true or false, got {_describe(value)}",
                                                     param=key)
  return value

def _stop(body: dict[str, Any]) -> tuple[str, ...]:
  value = body.get("stop")
  if value is None: return ()
  stops = [value] if isinstance(value, str) else value
  if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS:
    raise RequestError(f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings, got "
                       f"{_describe(value)}", param="stop")
  for stop in stops:
    if not 1 <= len(_text(stop, "stop")) <= MAX_STOP_CHARS:
      raise RequestError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters, got {_describe(stop)}",
                         param="stop")
  return tuple(stops)

def _content(value: Any, i: int) -> str:
  """A message's content: a string, or a list of {"type": "text", "text"} parts (joined by newlines)."""
  param = f"messages[{i}].content"
  if isinstance(value, str): return _text(value, param)
  if isinstance(value, list) and value:
    texts = []
    for j, part in enumerate(value):
      if not isinstance(part, dict) or part.get("type") != "text":
        raise RequestError(f"{param}[{j}] must be a {{\"type\": \"text\", \"text\": ...}} part; this server reads "
                           f"text only, got {_describe(part)}", param="messages")
      texts.append(_text(part.get("text"), f"{param}[{j}].text"))
    return "\n".join(texts)
  raise RequestError(f"{param} must be a string or a non-empty list of text parts, got {_describe(value)}",
                     param="messages")

def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise RequestError("'messages' is required: a non-empty list of {\"role\", \"content\"} objects",
                       param="messages")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
      raise RequestError(f"messages[{i}] must be an object with a 'role' of {', '.join(CHAT_ROLES)} and a 'content', "
                         f"got {_describe(m)}", param="messages")
    out.append({"role": m["role"], "content": _content(m.get("content"), i)})
  return out

def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
  """Choice `index`'s sampling: a seeded request's choice 0 keeps the seed (so n=1 and the first of n agree), the
  others sample with seeds derived from (seed, index)."""
  if index == 0 or params.seed is None: return params
  seed = int(np.random.SeedSequence([params.seed, index]).generate_state(1, np.uint64)[0])
  return dataclasses.replace(params, seed=seed)

class StopText:
  """Decoded text checked for stop strings: `push` returns the text that can no longer begin a stop string, and the
  stop string completed first (as if the text arrived one character at a time, so however it is split into tokens)
  ends the text (`stopped`), itself left out."""
  def __init__(self, stops: tuple[str, ...]):
    self.stops, self.pending, self.stopped = stops, "", False

  def push(self, piece: str) -> str:
    self.pending += piece
    hits = [(at + len(stop), at) for stop in self.stops if (at := self.pending.find(stop)) >= 0]
    if hits:
      self.stopped = True
      released, self.pending = self.pending[:min(hits)[1]], ""  # the earliest end; of those, the longest
      return released
    # hold back the longest tail that a stop string starts with: the next piece may complete it
    hold = max((k for stop in self.stops for k in range(min(len(stop) - 1, len(self.pending)), 0, -1)
                if self.pending.endswith(stop[:k])), default=0)
    released, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
    return released

  def flush(self) -> str:
    released, self.pending = self.pending, ""
    return released

# ** the service **

def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
  """`token`'s log probability under `logits` (a log-softmax in float64) and the `top` most likely tokens'."""
  scores = logits.astype(np.float64)
  shifted = scores - scores.max()
  logprobs = shifted - np.log(np.exp(shifted).sum())
  best = np.argsort(-logprobs, kind="stable")[:top]
  return TokenLogprob(token, float(logprobs[token]), tuple((int(i), float(logprobs[i])) for i in best))

class _LockedSession:
  """A cache slot whose forward passes take the model lock: what `generate` drives for one request. It keeps the last
  logits, from which the token `generate` samples next is drawn."""
  def __init__(self, session: LlamaSession | BatchSession, lock: threading.Lock | contextlib.nullcontext[None]):
    self.session, self.lock, self.max_context = session, lock, session.max_context
    self.logits: np.ndarray | None = None
  @property
  def pos(self) -> int: return self.session.pos
  def reset(self) -> None: self.session.reset()
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
    with self.lock: self.logits = self.session.forward(tokens)
    return self.logits

class LLMService:
  """The model, tokenizer and request slots behind the HTTP handler; usable without HTTP (`parse`, `complete`)."""
  def __init__(self, model: Llama, tokenizer: BPETokenizer, chat_template: str | None, model_id: str, slots: int = 2,
               batched: bool = False):
    if slots < 1: raise RequestError(f"the server needs at least one request slot, got {slots}")
    self.model, self.tokenizer, self.chat_template, self.model_id = model, tokenizer, chat_template, model_id
    self.lock: threading.Lock | contextlib.nullcontext[None] = threading.Lock()
    self.slots: queue.Queue[LlamaSession | BatchSession] = queue.Queue()
    if batched:  # batched serving (ember.nn.llm.batch): the slots' forwards run together in the engine's steps
      self.engine = BatchEngine(model, slots)
      self.lock = contextlib.nullcontext()
      for session in self.engine.sessions: self.slots.put(session)
    else:
      for _ in range(slots): self.slots.put(LlamaSession(model))
    self.created = int(time.time())

  def warm_up(self, progress: ProgressBar) -> None:
    """Compile and capture the model's steps in a request slot before serving, so the first request does not wait
    for them (`progress` shows it)."""
    session = self.slots.get()
    try: warm_up(_LockedSession(session, self.lock), progress)
    finally: self.slots.put(session)

  def parse(self, kind: str, body: Any) -> Job:
    """Validate a request body (already JSON-decoded) into a Job, or raise RequestError. Every field is checked
    before the prompt is tokenized; nothing here runs the model."""
    if not isinstance(body, dict): raise RequestError(f"the request body must be a JSON object, got {_describe(body)}")
    model = body.get("model")
    if model is not None and _text(model, "model") != self.model_id:
      raise RequestError(f"model {model!r} does not exist; this server serves {self.model_id!r}", 404, "model",
                         "model_not_found")
    for key, off in UNSUPPORTED.items():
      if body.get(key) is not None and body[key] not in off:
        raise RequestError(f"'{key}' is not supported by this server; leave it out (or set it to "
                           f"{json.dumps(off[0])})", param=key, code="unsupported_parameter")
    prompt = self._prompt(kind, body)
    limit = self.model.max_context
    # past the context's room is checked below, with a message that says how much room there is
    max_tokens = _int(body, "max_completion_tokens", None, 1, 2**63 - 1) or _int(body, "max_tokens", None, 1, 2**63 - 1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _int(body, "top_k", 0, 0, 2**31 - 1)
    seed = _int(body, "seed", None, 0, 2**64 - 1)
    n = _int(body, "n", 1, 1, MAX_CHOICES)
    stop = _stop(body)
    stream = _bool(body, "stream")
    include_usage = self._stream_options(body, stream)
    logprobs = self._logprobs(kind, body)
    ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
    if not ids: raise RequestError("the prompt encodes to no tokens", param="prompt")
    room = limit - len(ids)
    param = "messages" if kind == "chat" else "prompt"
    if room <= 0:
      raise RequestError(f"the prompt is {len(ids)} tokens but the context holds {limit}; shorten it", param=param,
                         code="context_length_exceeded")
    if max_tokens is None: max_tokens = room if kind == "chat" else min(DEFAULT_COMPLETION_TOKENS, room)
    if max_tokens > room:
      raise RequestError(f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the context of {limit} tokens; "
                         f"lower max_tokens to {room} or less", param="max_tokens", code="context_length_exceeded")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return Job(kind, ids, max_tokens, params, stream, n, stop, include_usage, logprobs)

  @staticmethod
  def _logprobs(kind: str, body: dict[str, Any]) -> int | None:
    """How many alternatives to report per token (None: no log probabilities): completions' `logprobs` is that
    number, chat's `logprobs` a switch and `top_logprobs` the number."""
    if kind == "completion": return _int(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    top = _int(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if not _bool(body, "logprobs"):
      if top is not None: raise RequestError("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
      return None
    return top or 0

  def _prompt(self, kind: str, body: dict[str, Any]) -> str | list[int]:
    """The prompt as text (chat: rendered with the template) or as token ids (a completion prompt of integers)."""
    if kind == "chat": return render_chat(self.chat_template, _messages(body))
    given = body.get("prompt")
    shape = "'prompt' is required: a string, a list of one string, a list of token ids or a list of one such list"
    if isinstance(given, list) and len(given) == 1 and isinstance(given[0], (str, list)): given = given[0]
    if isinstance(given, str): return _text(given, "prompt")
    if not isinstance(given, list) or not given: raise RequestError(f"{shape}, got {_describe(given)}", param="prompt")
    if len(given) > 1 and all(isinstance(t, (str, list)) for t in given):
      raise RequestError(f"this server takes one prompt per request, got {len(given)}; send one request per prompt",
                         param="prompt")
    vocab = self.tokenizer.vocab_size
    for t in given:
      if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
        raise RequestError(f"{shape}; token ids are integers in [0, {vocab}), got {_describe(t)}", param="prompt")
    return list(given)

  @staticmethod
  def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None: return False
    if not stream: raise RequestError("'stream_options' is only allowed with \"stream\": true", param="stream_options")
    if not isinstance(options, dict):
      raise RequestError(f"'stream_options' must be an object, got {_describe(options)}", param="stream_options")
    return _bool(options, "include_usage")

  def complete(self, job: Job, index: int = 0, on_text: Callable[[str, list[TokenLogprob]], None] | None = None,
               client_gone: Callable[[], bool] | None = None) -> Choice:
    """Generate choice `index` of `job` in a free slot; `on_text` receives the text as it is decoded (held back
    only while it may be the start of a stop string) with the log probabilities of the tokens generated since its
    previous call (when the job asks for them). `client_gone` is asked after every token: when it says True,
    generation stops and ClientGoneError is raised."""
    session = self.slots.get()
    try:
      session.reset()
      locked = _LockedSession(session, self.lock)
      decoder, stops = self.tokenizer.stream_decoder(), StopText(job.stop)
      pieces: list[str] = []
      logprobs: list[TokenLogprob] = []
      sent, generated = 0, 0  # log probabilities passed to on_text so far, tokens generated
      def emit(text: str) -> None:
        nonlocal sent
        if text:
          pieces.append(text)
          if on_text is not None: on_text(text, logprobs[sent:])
          sent = len(logprobs)
      def on_token(token_id: int) -> bool:
        nonlocal generated
        generated += 1
        if client_gone is not None and client_gone():
          raise ClientGoneError(f"the client closed the connection after {generated} generated tokens; stopped")
        if token_id in self.tokenizer.stop_ids: return False  # generate ends on it
        if job.logprobs is not None:
          assert locked.logits is not None  # generate samples each token from the logits of the forward before it
          logprobs.append(token_logprob(locked.logits, token_id, job.logprobs))
        emit(stops.push(decoder.push(token_id)))
        return stops.stopped
      out = generate(locked, job.prompt_ids, job.max_tokens, _choice_params(job.params, index),
                     self.tokenizer.stop_ids, on_token)
      if not stops.stopped:
        emit(stops.push(decoder.flush()))
        emit(stops.flush())
    finally:
      self.slots.put(session)
    finish = "stop" if stops.stopped or (out and out[-1] in self.tokenizer.stop_ids) else "length"
    return Choice("".join(pieces), finish, len(out), logprobs)

# ** HTTP **

class LLMRequestHandler(BaseHTTPRequestHandler):
  service: LLMService  # set on the per-server subclass by make_server, with `timeout` (seconds, per socket operation)
  protocol_version = "HTTP/1.1"
  responded = False  # whether this request's status line and headers went out (then errors go into the stream)
  streaming = False

  def log_message(self, format: str, *args: Any) -> None:
    log.info("%s - %s", self.address_string(), format % args)

  def __getattr__(self, name: str) -> Any:
    # the standard library looks up `do_<METHOD>`: every method goes through the router, which answers 404 or 405
    # (instead of the library's 501 for methods without a `do_` function)
    if name.startswith("do_"): return lambda: self._handle(name.removeprefix("do_"))
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

  def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
    """The standard library's own errors (a malformed request line, oversized headers) in OpenAI's error shape."""
    # a garbled request line is parsed as HTTP/0.9, whose replies have no status line: answer in HTTP/1.0
    if self.request_version == "HTTP/0.9": self.request_version = "HTTP/1.0"
    self._error(RequestError(message or HTTPStatus(code).phrase, code, code=HTTPStatus(code).name.lower()))

  def end_headers(self) -> None:
    self.responded = True
    super().end_headers()

  def _handle(self, method: str) -> None:
    self.responded = self.streaming = False
    try: self._route(method)
    except RequestError as e: self._fail(e)
    except (ConnectionError, TimeoutError) as e:  # the client went away or stopped reading: nobody to answer
      log.info("%s %s: the client connection failed (%s)", method, self.path, e)
      self.close_connection = True
    except Exception as e:
      log.exception("%s %s failed", method, self.path)
      self._fail(RequestError(f"internal server error ({type(e).__name__}: {e}); the server log has the traceback",
                              500, code="server_error"))

  def _route(self, method: str) -> None:
    path = urlsplit(self.path).path.rstrip("/") or "/"
    if method != "POST" and self.headers.get("Content-Length", "0") != "0":
      self.close_connection = True  # a body nobody reads must not be taken for the next request
    route = "/v1/models" if path.startswith("/v1/models/") else path
    if route not in ROUTES:
      raise RequestError(f"no route {method} {self.path}; the routes are "
                         f"{', '.join(f'{m} {p}' for p, m in ROUTES.items())}", 404, code="not_found")
    if method != ROUTES[route]:
      raise RequestError(f"{method} is not allowed on {route}; use {ROUTES[route]}", 405, code="method_not_allowed",
                         headers={"Allow": ROUTES[route]})
    if route in PAGE_FILES: return self._page(route)
    if route == "/v1/models": return self._models(path)
    job = self.service.parse("chat" if route == "/v1/chat/completions" else "completion", self._body())
    self._stream(job) if job.stream else self._reply(job)

  def _page(self, route: str) -> None:
    name, content_type = PAGE_FILES[route]
    data = resources.files(__package__).joinpath("static", name).read_bytes()
    self._send(200, data, content_type, PAGE_HEADERS)

  def _client_gone(self) -> bool:
    """Whether the client closed its connection: its socket reads as end of file without waiting (a client that
    sent more, such as a pipelined request, is still there)."""
    try:
      readable, _, _ = select.select([self.connection], [], [], 0)
      return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
    except OSError: return True  # reset by the peer

  def _models(self, path: str) -> None:
    card = {"id": self.service.model_id, "object": "model", "created": self.service.created, "owned_by": "ember"}
    if path == "/v1/models": return self._json(200, {"object": "list", "data": [card]})
    if path.removeprefix("/v1/models/") != self.service.model_id:
      raise RequestError(f"model {path.removeprefix('/v1/models/')!r} does not exist; this server serves "
                         f"{self.service.model_id!r}", 404, "model", "model_not_found")
    self._json(200, card)

  def _body(self) -> Any:
    length = self.headers.get("Content-Length")
    if length is None: raise RequestError("a JSON body with a Content-Length is required", 411, code="length_required")
    if not length.isdigit() or not length.isascii():
      raise RequestError(f"Content-Length must be a number of bytes, got {_describe(length)}", code="invalid_request")
    if len(length) > 9 or int(length) > MAX_BODY_BYTES:
      shown = length if len(length) <= MAX_INT_DIGITS else f"a {len(length)}-digit number of"
      raise RequestError(f"the body is {shown} bytes; at most {MAX_BODY_BYTES} are accepted", 413,
                         code="request_too_large")
    try: raw = self.rfile.read(int(length))
    except TimeoutError as e:
      raise RequestError(f"the body did not arrive: no bytes for {self.timeout} s", 408, code="timeout") from e
    if len(raw) < int(length):
      raise RequestError(f"the body ended after {len(raw)} of {length} bytes", code="incomplete_body")
    return parse_json(raw)

  def _reply(self, job: Job) -> None:
    choices = [self.service.complete(job, i, client_gone=self._client_gone) for i in range(job.n)]
    out: list[dict[str, Any]] = []
    tokenizer = self.service.tokenizer
    for i, c in enumerate(choices):
      logprobs = None if job.logprobs is None else render_logprobs(job.kind, tokenizer, c.logprobs)
      if job.kind == "chat":
        out.append({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs,
                    "finish_reason": c.finish_reason})
      else: out.append({"index": i, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason})
    self._json(200, {**self._envelope(job, chunk=False), "choices": out, "usage": _usage(job, choices)})

  def _stream(self, job: Job) -> None:
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.send_header("Connection", "close")  # the stream ends when the connection does (no Content-Length)
    self.end_headers()
    self.close_connection = self.streaming = True
    envelope = {**self._envelope(job, chunk=True), **({"usage": None} if job.include_usage else {})}
    tokenizer = self.service.tokenizer
    def choice(index: int, text: str | None, finish: str | None, logprobs: Sequence[TokenLogprob],
               role: bool = False) -> dict[str, Any]:
      rendered = None if job.logprobs is None or role else render_logprobs(job.kind, tokenizer, logprobs)
      if job.kind == "completion":
        return {"index": index, "text": text or "", "logprobs": rendered, "finish_reason": finish}
      delta: dict[str, str] = {"role": "assistant"} if role else {}
      if text is not None: delta["content"] = text
      return {"index": index, "delta": delta, "logprobs": rendered, "finish_reason": finish}
    choices: list[Choice] = []
    for i in range(job.n):
      if job.kind == "chat": self._event({**envelope, "choices": [choice(i, None, None, [], role=True)]})
      sent = 0  # log probabilities streamed so far
      def on_text(text: str, logprobs: Sequence[TokenLogprob] = (), index: int = i) -> None:
        nonlocal sent
        self._event({**envelope, "choices": [choice(index, text, None, logprobs)]})
        sent += len(logprobs)
      done = self.service.complete(job, i, on_text, self._client_gone)
      self._event({**envelope, "choices": [choice(i, None, done.finish_reason, done.logprobs[sent:])]})
      choices.append(done)
    if job.include_usage: self._event({**envelope, "choices": [], "usage": _usage(job, choices)})
    self._event("[DONE]")

  def _event(self, payload: Any) -> None:
    self.wfile.write(f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode())
    self.wfile.flush()

  def _envelope(self, job: Job, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.kind == "chat" else "text_completion"
    prefix = "chatcmpl" if job.kind == "chat" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": self.service.model_id}

  def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    self._send(status, json.dumps(payload).encode(), "application/json", headers)

  def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
    self.send_response(status)
    for key, value in {"Content-Type": content_type, "Content-Length": str(len(data)), **(headers or {})}.items():
      self.send_header(key, value)
    self.end_headers()
    if self.command != "HEAD": self.wfile.write(data)

  def _error(self, e: RequestError) -> None:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    self.close_connection = True  # an unread or partly read body must not be taken for the next request
    self._json(e.status, {"error": {"message": str(e), "type": kind, "param": e.param, "code": e.code}},
               {"Connection": "close", **e.headers})

  def _fail(self, e: RequestError) -> None:
    """Answer `e`: as an error reply, or as the last event of a stream already under way; a failed write means the
    client is gone."""
    self.close_connection = True
    try:
      if not self.responded: self._error(e)
      elif self.streaming:
        self._event({"error": {"message": str(e), "type": "server_error", "param": e.param, "code": e.code}})
    except OSError as write_error: log.info("could not send the error reply to %s: %s", self.path, write_error)

def render_logprobs(kind: str, tokenizer: BPETokenizer, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
  """Log probabilities in OpenAI's shape for the endpoint: completions' parallel lists (a token's text offset counted
  from the start of the generated text), chat's list of entries with each token's UTF-8 bytes."""
  def text(token: int) -> str: return tokenizer.token_bytes(token).decode("utf-8", errors="replace")
  if kind == "chat":
    def entry(token: int, logprob: float) -> dict[str, Any]:
      return {"token": text(token), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token))}
    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]}
                        for t in logprobs], "refusal": None}
  tokens = [text(t.token) for t in logprobs]
  offsets = np.cumsum([0] + [len(s) for s in tokens[:-1]]).tolist() if tokens else []
  return {"tokens": tokens, "token_logprobs": [t.logprob for t in logprobs],
          "top_logprobs": [{text(i): lp for i, lp in t.top} for t in logprobs], "text_offset": offsets}

def _usage(job: Job, choices: list[Choice]) -> dict[str, int]:
  generated = sum(c.tokens for c in choices)
  return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": generated,
          "total_tokens": len(job.prompt_ids) + generated}

def make_server(service: LLMService, port: int = 8000, host: str = "127.0.0.1",
                timeout: float = READ_TIMEOUT_S) -> ThreadingHTTPServer:
  """A threading HTTP server bound to host:port (port 0 picks a free one: `server.server_address[1]`); call
  `serve_forever()` on it, `shutdown()` from another thread to stop. A connection that sends nothing for `timeout`
  seconds in the middle of a request is answered 408 and closed (an idle keep-alive one is closed)."""
  if not (math.isfinite(timeout) and timeout > 0):
    raise RequestError(f"the read timeout must be a positive number of seconds, got {timeout}")
  handler = type("BoundLLMRequestHandler", (LLMRequestHandler,), {"service": service, "timeout": timeout})
  server = ThreadingHTTPServer((host, port), handler)
  server.daemon_threads = True
  return server
