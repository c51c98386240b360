"""Seeded random malformed requests against the OpenAI-compatible server (the tiny random model): every one gets a
well-formed HTTP reply, never a dropped connection, a hang or a 500. A reply is well-formed when it is a 2xx with a
JSON body holding choices or an event stream ending in [DONE], or a 4xx whose JSON body is an OpenAI error
{"error": {"message", "type", "param", "code"}}.

Each case is built from its own seed (`build_case(seed)` gives its request bytes): a valid completion or chat body,
then one to three mutations drawn from the classes the server must survive: hostile field values (negative, huge,
NaN/Infinity, lone surrogates, wrong types), deep nesting, deleted fields, unknown fields, integers of thousands of
digits, truncated or byte-flipped bodies, wrong or missing Content-Length, other methods and paths.
"""
from __future__ import annotations
import json
import random
import socket
import threading
from typing import Any, Iterator
import pytest
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import Llama
from ember.nn.llm.server import LLMService, make_server
from ember.nn.llm.tokenizer import BPETokenizer

pytestmark = pytest.mark.fuzz
CASES = 300
READ_TIMEOUT_S = 0.5  # the server's: a body shorter than its Content-Length is answered 408 after this
ANSWERS = {200, 400, 404, 405, 408, 411, 413}

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "n", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "echo", "presence_penalty", "user"]
HOSTILE: list[Any] = [
  -1, 0, 1, 3, -2**63, 2**63, 2**64, 10**30, 0.5, -0.0, 2.5, 1e308, float("nan"), float("inf"), float("-inf"), True,
  False, None, "", "x", "\ud800", "a\udfffb", "\U0001f600", "<|im_end|>", "\x00", "9" * 30, [], {}, [1], ["a"],
  ["a", "b", "c", "d", "e"], [[1, 2]], {"include_usage": True}, {"include_usage": "yes"}, {"role": "user"},
  [{"role": "user", "content": "\ud800"}], [{"role": "user", "content": [{"type": "image_url"}]}], [None],
  [{"role": "tool", "content": "x"}], [{"role": "user", "content": 5}],
]

def valid_body(rng: random.Random) -> tuple[str, dict[str, Any]]:
  common = {"max_tokens": rng.randint(1, 3), "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 99)}
  if rng.random() < 0.5: return "/v1/completions", {"model": "tiny", "prompt": rng.choice([" the", "a hat"]), **common}
  return "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **common}

def nest(value: Any, depth: int) -> Any:
  for _ in range(depth): value = [value]
  return value

def mutate_body(rng: random.Random, body: dict[str, Any]) -> None:
  kind = rng.randrange(5)
  key = rng.choice(FIELDS + [f"unknown_{rng.randrange(5)}"])
  if kind == 0: body[key] = rng.choice(HOSTILE)
  elif kind == 1: body.pop(rng.choice(list(body) or ["model"]), None)
  elif kind == 2: body[key] = nest(rng.choice(HOSTILE), rng.choice([1, 5, 31, 32, 300]))
  elif kind == 3 and isinstance(body.get("messages"), list):
    body["messages"].append({"role": rng.choice(["user", "assistant", "wizard", 7]), "content": rng.choice(HOSTILE)})
  else: body["stream"] = True

def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
  kind = rng.randrange(4)
  if kind == 0: return data[:rng.randrange(len(data) + 1)]
  if kind == 1:
    flipped = bytearray(data)
    for _ in range(rng.randint(1, 4)): flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    return bytes(flipped)
  if kind == 2:  # a number of thousands of digits somewhere a value goes
    return data.replace(b": ", b": " + rng.choice([b"-", b""]) + b"7" * rng.choice([25, 4301, 6000]) + b", \"x\": ", 1)
  deep = rng.choice([40, 5000, 200_000])
  return rng.choice([data[:-1] + b", \"deep\": " + b"[" * deep + b"]" * deep + b"}", b"[" * deep, b"{\"a\":" * deep,
                     b"\xff\xfe\x00", b"null", b"[]", b"\"\\ud800\""])

def build_case(seed: int) -> bytes:
  rng = random.Random(seed)
  path, body = valid_body(rng)
  for _ in range(rng.randint(1, 3)): mutate_body(rng, body)
  data = json.dumps(body).encode()  # NaN and Infinity come out as the bare words, lone surrogates as \ud800
  if rng.random() < 0.3: data = mutate_bytes(rng, data)
  method = "POST"
  length = str(len(data))
  roll = rng.random()
  if roll < 0.05: method = rng.choice(["GET", "PUT", "DELETE", "BREW"])
  elif roll < 0.10: path = rng.choice(["/", "/v1", "/v1/models/tiny", "/v1/completions?x=1", "/v1/../etc/passwd"])
  elif roll < 0.22: length = rng.choice(["", "-1", "abc", "9" * 40, str(len(data) + rng.randint(1, 10)), "0"])
  headers = f"{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nContent-Type: application/json\r\n"
  if length: headers += f"Content-Length: {length}\r\n"
  return headers.encode() + b"\r\n" + data

@pytest.fixture(scope="module")
def fuzz_url(tiny_llama_module) -> Iterator[tuple[str, int]]:
  path, _, _ = tiny_llama_module
  f = GGUFFile(path)
  service = LLMService(Llama.from_gguf(f, max_context=48), BPETokenizer.from_gguf_metadata(f.metadata),
                       f.metadata["tokenizer.chat_template"], "tiny", slots=2)
  server = make_server(service, port=0, timeout=READ_TIMEOUT_S)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try: yield server.server_address
  finally:
    server.shutdown()
    server.server_close()

def exchange(address: tuple[str, int], data: bytes) -> bytes:
  with socket.create_connection(address, timeout=30) as sock:  # 30 s without a byte is a hang: the test fails
    sock.sendall(data)
    return b"".join(iter(lambda: sock.recv(65536), b""))

def check_reply(reply: bytes) -> int:
  """The reply's status, after checking that it is well-formed (AssertionError says how it is not)."""
  assert reply, "the connection was closed without a reply"
  head, _, body = reply.partition(b"\r\n\r\n")
  status_line, *lines = head.decode("latin-1").split("\r\n")
  assert status_line.startswith("HTTP/1.") and len(status_line.split()) >= 2, status_line
  status = int(status_line.split()[1])
  assert status in ANSWERS, f"status {status}: {body[:500]!r}"
  headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
  if headers.get("content-type") == "text/event-stream":
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1]), events[-3:]
    return status
  assert int(headers["content-length"]) == len(body)
  payload = json.loads(body)
  if status == 200: assert "choices" in payload or "data" in payload or payload.get("object") == "model"
  else:
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    assert payload["error"]["type"] == "invalid_request_error" and payload["error"]["message"]
  return status

def test_seeded_malformed_requests_all_get_replies(fuzz_url):
  failures, seen = [], set()
  for seed in range(CASES):
    data = build_case(seed)
    try: seen.add(check_reply(exchange(fuzz_url, data)))
    except (AssertionError, OSError, ValueError) as e: failures.append(f"case {seed}: {e!r}; request {data[:300]!r}")
  assert not failures, f"{len(failures)} of {CASES} requests got no well-formed reply:\n" + "\n".join(failures[:10])
  assert seen == ANSWERS  # the cases reach every kind of reply the server gives
