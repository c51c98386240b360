"""The OpenAI-compatible server over real HTTP (urllib) against a server started here on a free port: the tiny random
model for the fast tests, its greedy text checked against the numpy reference model; the chat page's files and
headers; a client that hangs up stopping its generation; (marked `model`) SmolLM2's chat reply against the golden
file."""
from __future__ import annotations
import contextlib
import html.parser
import importlib.resources
import json
import logging
import math
import random
import socket
import threading
import urllib.error
import urllib.request
from typing import Any, Iterator
import numpy as np
import pytest
from ember.nn.llm.generate import SamplingError, SamplingParams
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import KVCache, Llama, LlamaSession
from ember.nn.llm.server import LLMService, StopText, make_server
from ember.nn.llm.tokenizer import BPETokenizer, render_chat

MAX_CONTEXT = 48

@contextlib.contextmanager
def serving(service: LLMService, timeout: float = 30.0) -> Iterator[str]:
  """`service` over HTTP on a free port for the block: its base URL."""
  server = make_server(service, port=0, timeout=timeout)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try: yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()

@pytest.fixture(scope="module")
def tiny_service(tiny_llama_module) -> LLMService:
  path, _, _ = tiny_llama_module
  f = GGUFFile(path)
  tok = BPETokenizer.from_gguf_metadata(f.metadata)
  return LLMService(Llama.from_gguf(f, max_context=MAX_CONTEXT), tok, f.metadata["tokenizer.chat_template"], "tiny",
                    slots=2)

@pytest.fixture(scope="module")
def tiny_server(tiny_llama_module, tiny_service) -> Iterator[tuple[str, BPETokenizer, str, dict[str, np.ndarray],
                                                                   dict]]:
  _, hf, cfg = tiny_llama_module
  with serving(tiny_service) as url: yield url, tiny_service.tokenizer, tiny_service.chat_template or "", hf, cfg

def request(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
  data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
  req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=60) as resp: return resp.status, json.loads(resp.read())
  except urllib.error.HTTPError as e: return e.code, json.loads(e.read())

def stream(url: str, body: dict[str, Any]) -> list[Any]:
  req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                               headers={"Content-Type": "application/json"})
  events = []
  with urllib.request.urlopen(req, timeout=60) as resp:
    assert resp.headers["Content-Type"] == "text/event-stream"
    for line in resp.read().decode().split("\n\n"):
      if not line: continue
      assert line.startswith("data: ")
      events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
  return events

@pytest.fixture(scope="session")
def reference_greedy(reference_logits):
  def greedy(hf, cfg, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n): ids.append(int(np.argmax(reference_logits(hf, cfg, ids)[-1])))
    return ids[-n:]
  return greedy

def test_models_endpoint(tiny_server):
  url, *_ = tiny_server
  status, body = request(url + "/v1/models")
  assert status == 200 and [m["id"] for m in body["data"]] == ["tiny"]

def test_completion_matches_reference(tiny_server, reference_greedy):
  url, tok, _, hf, cfg = tiny_server
  status, body = request(url + "/v1/completions", {"model": "tiny", "prompt": " the", "max_tokens": 4,
                                                   "temperature": 0})
  assert status == 200 and body["object"] == "text_completion"
  expected = reference_greedy(hf, cfg, tok.encode(" the"), 4)
  assert body["choices"][0]["text"] == tok.decode([t for t in expected if t not in tok.stop_ids])
  assert body["usage"] == {"prompt_tokens": len(tok.encode(" the")), "completion_tokens": 4, "total_tokens":
                           len(tok.encode(" the")) + 4}

def test_chat_completion_matches_reference(tiny_server, reference_greedy):
  url, tok, template, hf, cfg = tiny_server
  messages = [{"role": "user", "content": "hi"}]
  status, body = request(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 3, "temperature": 0})
  assert status == 200 and body["object"] == "chat.completion"
  ids = tok.encode(render_chat(template, messages))
  expected = reference_greedy(hf, cfg, ids, 3)
  message = body["choices"][0]["message"]
  assert message == {"role": "assistant", "content": tok.decode([t for t in expected if t not in tok.stop_ids])}

def test_two_concurrent_streams_keep_their_own_caches(tiny_server, reference_greedy):
  url, tok, template, hf, cfg = tiny_server
  prompts = [[{"role": "user", "content": "the tin"}], [{"role": "user", "content": "a hat in the"}]]
  results: dict[int, list[Any]] = {}
  def run(i: int) -> None:
    results[i] = stream(url + "/v1/chat/completions", {"messages": prompts[i], "max_tokens": 8, "temperature": 0})
  threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
  for t in threads: t.start()
  for t in threads: t.join(120)
  for i, messages in enumerate(prompts):
    events = results[i]
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    expected = reference_greedy(hf, cfg, tok.encode(render_chat(template, messages)), 8)
    assert text == tok.decode([t for t in expected if t not in tok.stop_ids])

def test_streamed_completion_equals_plain_completion(tiny_server):
  url, *_ = tiny_server
  body = {"prompt": " a hat", "max_tokens": 5, "temperature": 0}
  events = stream(url + "/v1/completions", body)
  _, plain = request(url + "/v1/completions", body)
  assert "".join(e["choices"][0]["text"] for e in events[:-1]) == plain["choices"][0]["text"]

@pytest.mark.parametrize("path, body, raw, status, fragment", [
  ("/v1/chat/completions", None, b"{not json", 400, "not valid JSON"),
  ("/v1/chat/completions", {"max_tokens": 3}, None, 400, "'messages' is required"),
  ("/v1/chat/completions", {"messages": [{"role": "user"}]}, None, 400, "messages[0]"),
  ("/v1/completions", {"prompt": 5}, None, 400, "'prompt' is required"),
  ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, None, 400, "'max_tokens' must be an integer"),
  ("/v1/completions", {"prompt": "x", "temperature": -1}, None, 400, "temperature"),
  ("/v1/completions", {"prompt": "x", "max_tokens": 1000}, None, 400, "exceed the context"),
  ("/v1/completions", {"prompt": " the" * 100}, None, 400, "context holds 48"),
  ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, None, 404, "does not exist"),
  ("/v1/embeddings", {"input": "x"}, None, 404, "no route"),
  # every field's type and range, checked before any model work
  ("/v1/completions", {"prompt": "x", "seed": -1}, None, 400, "'seed' must be an integer in [0, 18446744073709551615]"),
  ("/v1/completions", {"prompt": "x", "seed": 2**64}, None, 400, "'seed' must be an integer"),
  ("/v1/completions", {"prompt": "x", "seed": 1.5}, None, 400, "'seed' must be an integer"),
  ("/v1/completions", None, b'{"prompt": "x", "temperature": NaN}', 400, "NaN is not a JSON number"),
  ("/v1/completions", None, b'{"prompt": "x", "temperature": Infinity}', 400, "Infinity is not a JSON number"),
  ("/v1/completions", None, b'{"prompt": "x", "temperature": 1e999}', 400, "'temperature' must be a finite number"),
  ("/v1/completions", {"prompt": "x", "temperature": 2.5}, None, 400, "must be a finite number in [0, 2]"),
  ("/v1/completions", {"prompt": "x", "temperature": "hot"}, None, 400, "'temperature' must be a finite number"),
  ("/v1/completions", {"prompt": "x", "top_p": 0}, None, 400, "'top_p' must be a finite number in (0, 1]"),
  ("/v1/completions", {"prompt": "x", "top_p": 1.5}, None, 400, "'top_p'"),
  ("/v1/completions", {"prompt": "x", "top_k": -1}, None, 400, "'top_k' must be an integer"),
  ("/v1/completions", {"prompt": "x", "max_tokens": 0}, None, 400, "'max_tokens' must be an integer"),
  ("/v1/completions", {"prompt": "x", "max_tokens": True}, None, 400, "'max_tokens' must be an integer"),
  ("/v1/completions", {"prompt": "x", "max_tokens": 10**19}, None, 400, "'max_tokens' must be an integer"),
  ("/v1/completions", {"prompt": "x", "n": 0}, None, 400, "'n' must be an integer in [1, 128]"),
  ("/v1/completions", {"prompt": "x", "n": 129}, None, 400, "'n' must be an integer in [1, 128]"),
  ("/v1/completions", {"prompt": "x", "stop": 5}, None, 400, "'stop' must be a string or a list"),
  ("/v1/completions", {"prompt": "x", "stop": list("abcde")}, None, 400, "at most 4 strings"),
  ("/v1/completions", {"prompt": "x", "stop": [""]}, None, 400, "each stop string must have 1 to"),
  ("/v1/completions", {"prompt": "x", "stream": "yes"}, None, 400, "'stream' must be true or false"),
  ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, None, 400, "only allowed with"),
  ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, None, 400,
   "'include_usage' must be true or false"),
  ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": []}, None, 400, "must be an object"),
  ("/v1/completions", {"prompt": "x", "model": 5}, None, 400, "'model' must be a string"),
  ("/v1/completions", {"prompt": "x", "logprobs": 6}, None, 400, "'logprobs' must be an integer in [0, 5]"),
  ("/v1/completions", {"prompt": "x", "logprobs": True}, None, 400, "'logprobs' must be an integer in [0, 5]"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, None, 400,
   "'logprobs' must be true or false"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, None, 400,
   "'top_logprobs' needs \"logprobs\": true"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
   None, 400, "'top_logprobs' must be an integer in [0, 20]"),
  ("/v1/completions", {"prompt": "x", "echo": True}, None, 400, "'echo' is not supported"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, None,
   400, "'tools' is not supported"),
  ("/v1/completions", {"prompt": ["a", "b"]}, None, 400, "one prompt per request"),
  ("/v1/completions", {"prompt": [["a"]]}, None, 400, "token ids are integers"),
  ("/v1/completions", {"prompt": [1, 300]}, None, 400, "token ids are integers in [0, 300)"),
  ("/v1/completions", {"prompt": [1, True]}, None, 400, "token ids are integers"),
  ("/v1/completions", {"prompt": []}, None, 400, "'prompt' is required"),
  ("/v1/completions", [1, 2], None, 400, "must be a JSON object"),
  ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, None, 400, "messages[0] must be"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, None, 400, "messages[0].content"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, 400,
   "text only"),
  # lone surrogates (JSON's \ud800 escape) would crash the tokenizer
  ("/v1/completions", {"prompt": "a\ud800b"}, None, 400, "'prompt' holds a lone UTF-16 surrogate"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]}, None, 400, "lone UTF-16 surrogate"),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, None,
   400, "lone UTF-16 surrogate"),
  ("/v1/completions", {"prompt": "x", "stop": ["\ud800"]}, None, 400, "'stop' holds a lone UTF-16 surrogate"),
  # the JSON itself: nesting, integer size, encoding
  ("/v1/completions", None, b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
   "nests 100001 levels deep"),
  ("/v1/completions", None, b'{"prompt": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "max_tokens": [[[1]]]}', 400,
   "'max_tokens' must be an integer"),
  ("/v1/completions", None, b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, "integer of 5000 digits"),
  ("/v1/completions", None, b'{"prompt": "x", "unknown": -' + b"9" * 5000 + b"}", 400, "integer of 5000 digits"),
  ("/v1/completions", None, b'{"prompt": "\xff\xfe"}', 400, "not UTF-8"),
  ("/v1/completions", None, b"", 400, "not valid JSON"),
])
def test_bad_requests_get_json_errors(tiny_server, path, body, raw, status, fragment):
  url, *_ = tiny_server
  got, payload = request(url + path, body, raw)
  assert got == status and fragment in payload["error"]["message"], payload
  assert set(payload["error"]) == {"message", "type", "param", "code"}
  assert payload["error"]["type"] == "invalid_request_error"

def test_sessions_interleave_without_sharing_a_cache(tiny_llama, reference_logits):
  # two caches advanced in turns through the same captured steps each see only their own tokens
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=16)
  a, b = LlamaSession(model), LlamaSession(model, KVCache(model.new_cache().layers, model.max_context))
  seq_a, seq_b = [5, 77, 200, 3, 150, 42], [9, 8, 7, 6, 5, 4]
  a.forward(seq_a[:2])
  b.forward(seq_b[:3])
  for t in range(2, 6):
    np.testing.assert_allclose(a.forward([seq_a[t]]), reference_logits(hf, cfg, seq_a[:t + 1])[-1], rtol=1e-4,
                               atol=1e-4)
    if t + 1 < 6:
      np.testing.assert_allclose(b.forward([seq_b[t + 1]]), reference_logits(hf, cfg, seq_b[:t + 2])[-1], rtol=1e-4,
                                 atol=1e-4)

@pytest.mark.model
def test_smollm2_chat_over_http(smollm2_file, golden):
  tok = BPETokenizer.from_gguf_metadata(smollm2_file.metadata)
  service = LLMService(Llama.from_gguf(smollm2_file, max_context=128), tok,
                       smollm2_file.metadata["tokenizer.chat_template"], "smollm2", slots=1)
  server = make_server(service, port=0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    status, body = request(url, {"messages": [{"role": "user", "content": golden["chat"]["user"]}], "max_tokens": 40,
                                 "temperature": 0})
  finally:
    server.shutdown()
    server.server_close()
  assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
  assert body["choices"][0]["message"]["content"] == golden["chat"]["greedy_reply"].removesuffix("<|im_end|>")

# ** every request gets an HTTP reply **

def raw_http(url: str, data: bytes, timeout: float = 30.0) -> bytes:
  """Send `data` as it is over a new connection and read until the server closes it (a socket timeout fails the
  test: the server neither answered nor hung up)."""
  host, port = url.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=timeout) as sock:
    sock.sendall(data)
    chunks = []
    while chunk := sock.recv(65536): chunks.append(chunk)
  return b"".join(chunks)

def parse_reply(reply: bytes) -> tuple[int, dict[str, str], bytes]:
  head, _, body = reply.partition(b"\r\n\r\n")
  status_line, *header_lines = head.decode("latin-1").split("\r\n")
  headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
  return int(status_line.split()[1]), headers, body

def assert_error_shape(body: bytes, kind: str = "invalid_request_error") -> dict[str, Any]:
  error = json.loads(body)["error"]
  assert set(error) == {"message", "type", "param", "code"} and error["type"] == kind and error["message"]
  return error

@pytest.mark.parametrize("method, path, status, allow", [
  ("GET", "/v1/completions", 405, "POST"), ("POST", "/v1/models", 405, "GET"), ("DELETE", "/v1/models", 405, "GET"),
  ("PUT", "/v1/chat/completions", 405, "POST"), ("GET", "/nope", 404, None), ("GET", "/v1/models/gpt-4", 404, None),
])
def test_unknown_routes_and_methods(tiny_server, method, path, status, allow):
  url, *_ = tiny_server
  data = b"{}" if method in ("POST", "PUT") else None
  req = urllib.request.Request(url + path, data=data, method=method)
  with pytest.raises(urllib.error.HTTPError) as info: urllib.request.urlopen(req, timeout=60)
  assert info.value.code == status and info.value.headers.get("Allow") == allow
  assert_error_shape(info.value.read())

def test_model_card(tiny_server):
  url, *_ = tiny_server
  status, card = request(url + "/v1/models/tiny")
  assert status == 200 and card["id"] == "tiny" and card["object"] == "model"

@pytest.mark.parametrize("data, status, fragment", [
  (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411, "Content-Length"),
  (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413, "at most 1048576"),
  (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413,
   "the body is a 5000-digit number of bytes"),
  (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n", 400, "Content-Length must be"),
  (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{}", 400, "the body ended after 2 of 4"),
  (b"BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 405, "BREW is not allowed on /v1/models; use GET"),
  (b"BREW /teapot HTTP/1.1\r\nHost: x\r\n\r\n", 404, "no route BREW /teapot"),
  (b"\x00\x01 garbage\r\n\r\n", 400, "request"),
])
def test_malformed_http_gets_a_json_reply(tiny_server, data, status, fragment):
  url, *_ = tiny_server
  if b"Content-Length: 4\r\n" in data:  # a client that sends half a body and hangs up its sending side
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
      sock.sendall(data)
      sock.shutdown(socket.SHUT_WR)
      reply = b"".join(iter(lambda: sock.recv(65536), b""))
  else: reply = raw_http(url, data)
  got, _, body = parse_reply(reply)
  assert got == status and fragment in assert_error_shape(body)["message"]

def test_bug_gets_500_with_logged_traceback(tiny_server, tiny_service, monkeypatch, caplog):
  url, *_ = tiny_server
  def broken(job, index=0, on_text=None, client_gone=None): raise ZeroDivisionError("a bug")
  monkeypatch.setattr(tiny_service, "complete", broken)
  with caplog.at_level(logging.ERROR, logger="ember.nn.llm.server"):
    status, payload = request(url + "/v1/completions", {"prompt": "x"})
  assert status == 500 and "ZeroDivisionError: a bug" in payload["error"]["message"]
  assert payload["error"]["type"] == "server_error"
  assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)

def test_error_mid_stream_ends_the_stream_with_an_error_event(tiny_server, tiny_service, monkeypatch):
  url, *_ = tiny_server
  def broken(job, index=0, on_text=None, client_gone=None):
    on_text("partial", [])
    raise RuntimeError("lost the device")
  monkeypatch.setattr(tiny_service, "complete", broken)
  events = stream(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
  assert events[1]["choices"][0]["delta"] == {"content": "partial"}
  assert "[DONE]" not in events and "lost the device" in events[-1]["error"]["message"]
  assert events[-1]["error"]["type"] == "server_error"

# ** a stalled client is dropped after the read timeout **

@pytest.fixture(scope="module")
def impatient_server(tiny_service) -> Iterator[str]:
  with serving(tiny_service, timeout=0.3) as url: yield url

def test_client_stalling_mid_body_gets_408_and_is_disconnected(impatient_server):
  reply = raw_http(impatient_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                                     b'{"prompt": ', timeout=20)
  status, headers, body = parse_reply(reply)
  assert status == 408 and "no bytes for 0.3 s" in assert_error_shape(body)["message"]
  assert headers["connection"] == "close"

@pytest.mark.parametrize("data", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"])
def test_idle_or_half_headered_connection_is_closed(impatient_server, data):
  # raw_http returns only once the server hangs up; without a read timeout it would wait forever (and fail here)
  assert raw_http(impatient_server, data, timeout=20) == b""

def test_read_timeout_must_be_positive(tiny_service):
  for bad in (0.0, -1.0, math.nan):
    with pytest.raises(ValueError, match="read timeout must be a positive number"): make_server(tiny_service, 0,
                                                                                                timeout=bad)

def test_server_binds_localhost_by_default(tiny_service):
  server = make_server(tiny_service, port=0)
  try: assert server.server_address[0] == "127.0.0.1"
  finally: server.server_close()

def test_sampling_params_reject_non_finite_temperature_and_negative_seed():
  for temperature in (math.nan, math.inf):
    with pytest.raises(SamplingError, match="finite"): SamplingParams(temperature=temperature)
  with pytest.raises(SamplingError, match="seed"): SamplingParams(seed=-1)

# ** n, stop, stream_options.include_usage, prompt and content forms **

def plain_text(tok: BPETokenizer, ids: list[int]) -> str:
  return tok.decode([t for t in ids if t not in tok.stop_ids])

def test_n_greedy_choices_all_match_the_reference(tiny_server, reference_greedy):
  url, tok, _, hf, cfg = tiny_server
  status, body = request(url + "/v1/completions", {"prompt": " the", "max_tokens": 4, "temperature": 0, "n": 3})
  expected = plain_text(tok, reference_greedy(hf, cfg, tok.encode(" the"), 4))
  assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
  assert all(c["text"] == expected and c["finish_reason"] == "length" for c in body["choices"])
  assert body["usage"]["completion_tokens"] == 12

def test_n_seeded_choices_are_reproducible_and_choice_0_is_the_single_reply(tiny_server):
  url, *_ = tiny_server
  sampled = {"prompt": " the", "max_tokens": 12, "temperature": 2.0, "seed": 7}
  _, single = request(url + "/v1/completions", sampled)
  _, three = request(url + "/v1/completions", {**sampled, "n": 3})
  _, again = request(url + "/v1/completions", {**sampled, "n": 3})
  texts = [c["text"] for c in three["choices"]]
  assert texts == [c["text"] for c in again["choices"]] and texts[0] == single["choices"][0]["text"]
  assert len(set(texts)) > 1  # the other choices sample with their own seeds

def test_streamed_n_choices_equal_plain_choices(tiny_server):
  url, *_ = tiny_server
  body = {"messages": [{"role": "user", "content": "a hat"}], "max_tokens": 6, "temperature": 1.5, "seed": 3, "n": 2}
  _, plain = request(url + "/v1/chat/completions", body)
  events = stream(url + "/v1/chat/completions", body)
  assert events[-1] == "[DONE]"
  for choice in plain["choices"]:
    mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == choice["index"]]
    assert mine[0]["delta"] == {"role": "assistant"} and mine[-1]["finish_reason"] == choice["finish_reason"]
    assert "".join(c["delta"].get("content", "") for c in mine) == choice["message"]["content"]

def first_stop(text: str, stops: list[str]) -> int | None:
  """Where the text ends for `stops`, read one character at a time: the start of the first stop string completed."""
  for end in range(len(text) + 1):
    if starts := [end - len(s) for s in stops if text[:end].endswith(s)]: return min(starts)
  return None

@pytest.mark.parametrize("streamed", [False, True])
def test_stop_strings_end_the_text_at_the_first_one(tiny_server, reference_greedy, streamed):
  url, tok, _, hf, cfg = tiny_server
  ids = reference_greedy(hf, cfg, tok.encode(" the"), 12)
  text = plain_text(tok, ids)
  stops = ["zzz", "e the", "he t"]  # the first completed wins, whichever list position it has
  cut = first_stop(text, stops)
  assert cut is not None
  # the oracle's token count: the fewest tokens whose text holds a stop string
  used = next(m for m in range(1, len(ids) + 1) if first_stop(plain_text(tok, ids[:m]), stops) is not None)
  body = {"prompt": " the", "max_tokens": 12, "temperature": 0, "stop": stops}
  if streamed:
    events = stream(url + "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    got, finish = "".join(e["choices"][0]["text"] for e in events[:-2]), events[-3]["choices"][0]["finish_reason"]
    usage = events[-2]["usage"]
  else:
    _, reply = request(url + "/v1/completions", body)
    got, finish, usage = reply["choices"][0]["text"], reply["choices"][0]["finish_reason"], reply["usage"]
  assert got == text[:cut] and finish == "stop" and usage["completion_tokens"] == used

def test_sampled_stop_is_the_unstopped_text_cut_at_the_stop(tiny_server):
  url, *_ = tiny_server
  body = {"messages": [{"role": "user", "content": "the tin"}], "max_tokens": 20, "temperature": 2.0, "seed": 11}
  _, free = request(url + "/v1/chat/completions", body)
  text = free["choices"][0]["message"]["content"]
  stop = text[len(text) // 2:len(text) // 2 + 2]
  _, stopped = request(url + "/v1/chat/completions", {**body, "stop": stop})
  assert stopped["choices"][0] == {"index": 0, "finish_reason": "stop", "logprobs": None,
                                   "message": {"role": "assistant", "content": text[:text.find(stop)]}}

def test_stop_not_produced_keeps_the_whole_text(tiny_server):
  url, *_ = tiny_server
  body = {"prompt": " a hat", "max_tokens": 5, "temperature": 0}
  _, free = request(url + "/v1/completions", body)
  _, stopped = request(url + "/v1/completions", {**body, "stop": ["\u2603never"]})
  assert stopped["choices"] == free["choices"] and stopped["choices"][0]["finish_reason"] == "length"

def test_stop_text_holds_back_only_possible_stop_starts():
  # every split of a text into pieces releases the text up to the first stop string (an oracle: str.find)
  rng = random.Random(0)
  for _ in range(500):
    text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
    stops = tuple("".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4)))
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
    matcher, released = StopText(stops), []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
      released.append(matcher.push(text[a:b]))
      if matcher.stopped: break
      assert first_stop("".join(released), list(stops)) is None
    if not matcher.stopped: released.append(matcher.flush())
    cut = first_stop(text, list(stops))
    assert "".join(released) == (text if cut is None else text[:cut]) and matcher.stopped == (cut is not None)

def test_include_usage_adds_a_usage_chunk(tiny_server):
  url, *_ = tiny_server
  body = {"prompt": " the", "max_tokens": 3, "temperature": 0, "n": 2}
  _, plain = request(url + "/v1/completions", body)
  events = stream(url + "/v1/completions", {**body, "stream_options": {"include_usage": True}})
  assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"] == plain["usage"]
  assert all(e["usage"] is None for e in events[:-2])
  assert all("usage" not in e for e in stream(url + "/v1/completions", body)[:-1])

def test_prompt_forms_and_content_parts_give_the_same_reply(tiny_server):
  url, tok, *_ = tiny_server
  base = {"max_tokens": 4, "temperature": 0}
  replies = [request(url + "/v1/completions", {**base, "prompt": p})[1]["choices"][0]["text"]
             for p in (" a hat", [" a hat"], tok.encode(" a hat"), [tok.encode(" a hat")])]
  assert len(set(replies)) == 1
  chats = [request(url + "/v1/chat/completions", {**base, "messages": [{"role": "user", "content": c}]})[1]
           for c in ("a\nhat", [{"type": "text", "text": "a"}, {"type": "text", "text": "hat"}])]
  assert chats[0]["choices"] == chats[1]["choices"]

# ** the chat page **

class PageParser(html.parser.HTMLParser):
  """The tags and attributes of an HTML page, for checks that it holds no inline code or style."""
  def __init__(self) -> None:
    super().__init__()
    self.tags: list[tuple[str, dict[str, str | None]]] = []
    self.script_text = ""
    self._in_script = False
  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    self.tags.append((tag, dict(attrs)))
    self._in_script = tag == "script"
  def handle_endtag(self, tag: str) -> None: self._in_script = False
  def handle_data(self, data: str) -> None:
    if self._in_script: self.script_text += data

def fetch(url: str) -> tuple[int, Any, bytes]:
  with urllib.request.urlopen(url, timeout=60) as resp: return resp.status, resp.headers, resp.read()

@pytest.mark.parametrize("path, name, content_type", [
  ("/", "index.html", "text/html; charset=utf-8"), ("/chat.js", "chat.js", "text/javascript; charset=utf-8"),
  ("/chat.css", "chat.css", "text/css; charset=utf-8"), ("/favicon.svg", "favicon.svg", "image/svg+xml"),
])
def test_page_files_are_served_with_their_types_and_a_restrictive_csp(tiny_server, path, name, content_type):
  url, *_ = tiny_server
  status, headers, body = fetch(url + path)
  assert status == 200 and headers["Content-Type"] == content_type and headers["X-Content-Type-Options"] == "nosniff"
  assert body == importlib.resources.files("ember.nn.llm").joinpath("static", name).read_bytes() and body
  csp = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
  # nothing but the page's own files, and requests only back to this server
  assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'" and csp["frame-ancestors"] == "'none'"
  assert csp["script-src"] == "'self'" and csp["style-src"] == "'self'"

def test_page_has_no_inline_code_or_style_and_loads_only_its_own_files(tiny_server):
  # the CSP forbids inline scripts, handlers and styles: the page must not need them
  url, *_ = tiny_server
  parser = PageParser()
  parser.feed(fetch(url + "/")[2].decode())
  assert not parser.script_text.strip()
  for tag, attrs in parser.tags:
    assert "style" not in attrs and not any(name.startswith("on") for name in attrs), (tag, attrs)
    for ref in (attrs.get("src"), attrs.get("href")):
      assert ref is None or ref in ("/chat.js", "/chat.css", "/favicon.svg"), ref  # no CDN, no other origin
  loaded = [(tag, attrs.get("src") or attrs.get("href")) for tag, attrs in parser.tags if tag in ("script", "link")]
  assert sorted(loaded) == [("link", "/chat.css"), ("link", "/favicon.svg"), ("script", "/chat.js")]
  for tag, attrs in parser.tags:
    if tag == "meta" and attrs.get("name") == "viewport": assert "width=device-width" in (attrs["content"] or "")

def test_page_routes_refuse_other_methods(tiny_server):
  url, *_ = tiny_server
  req = urllib.request.Request(url + "/", data=b"{}", method="POST")
  with pytest.raises(urllib.error.HTTPError) as info: urllib.request.urlopen(req, timeout=60)
  assert info.value.code == 405 and info.value.headers["Allow"] == "GET"

# ** a client that hangs up stops its generation **

@pytest.fixture
def counted_forwards(monkeypatch) -> list[int]:
  """Every forward pass of a request slot appends its token count here."""
  calls: list[int] = []
  original = LlamaSession.forward
  def forward(self, tokens):
    calls.append(len(tokens))
    return original(self, tokens)
  monkeypatch.setattr(LlamaSession, "forward", forward)
  return calls

def wait_for_free_slots(service: LLMService, free: int) -> None:
  """Block until `free` request slots are free (a request took one, or every one is back)."""
  for _ in range(6000):
    if service.slots.qsize() == free: return
    threading.Event().wait(0.01)
  raise AssertionError(f"the server did not get to {free} free request slots in 60 s")

@pytest.mark.parametrize("streamed", [False, True])
def test_client_closing_the_connection_stops_generation(tiny_server, tiny_service, counted_forwards, streamed, caplog):
  # the model lock is held until the client is gone, so the server sees the closed socket at its first token
  url, *_ = tiny_server
  body = json.dumps({"prompt": " the", "max_tokens": 30, "temperature": 0, "stream": streamed}).encode()
  host, port = url.removeprefix("http://").split(":")
  with caplog.at_level(logging.INFO, logger="ember.nn.llm.server"):
    with tiny_service.lock:
      with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if streamed: assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # the stream's headers go out first
        wait_for_free_slots(tiny_service, 1)  # the request holds a slot and waits for the model lock
    wait_for_free_slots(tiny_service, 2)
  assert counted_forwards == [len(tiny_service.tokenizer.encode(" the"))]  # the prefill, no decode step
  assert any("closed the connection after 1 generated tokens" in r.getMessage() for r in caplog.records)

def test_server_keeps_generating_for_a_connected_client(tiny_server, tiny_service, counted_forwards):
  # the check between tokens must not take a client that is waiting for its reply as gone
  url, *_ = tiny_server
  status, body = request(url + "/v1/completions", {"prompt": " the", "max_tokens": 6, "temperature": 0,
                                                   "stop": "\u2603"})
  assert status == 200 and body["usage"]["completion_tokens"] == 6 and len(counted_forwards) == 6
