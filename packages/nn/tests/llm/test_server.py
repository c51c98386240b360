"""The OpenAI-compatible server over real HTTP (urllib) against a server started here on a free port: the tiny random
model for the fast tests, its greedy text checked against the numpy reference model; (marked `model`) SmolLM2's chat
reply against the golden file."""
from __future__ import annotations
import json
import threading
import urllib.error
import urllib.request
from typing import Any, Iterator
import numpy as np
import pytest
from ember.nn.llm.gguf import GGUFFile
from ember.nn.llm.model import KVCache, Llama, LlamaSession
from ember.nn.llm.server import LLMService, make_server
from ember.nn.llm.tokenizer import BPETokenizer, render_chatml

MAX_CONTEXT = 48

@pytest.fixture(scope="module")
def tiny_server(tiny_llama_module) -> Iterator[tuple[str, BPETokenizer, str, dict[str, np.ndarray], dict]]:
  path, hf, cfg = tiny_llama_module
  f = GGUFFile(path)
  tok = BPETokenizer.from_gguf_metadata(f.metadata)
  template = f.metadata["tokenizer.chat_template"]
  service = LLMService(Llama.from_gguf(f, max_context=MAX_CONTEXT), tok, template, "tiny", slots=2)
  server = make_server(service, port=0)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try: yield f"http://127.0.0.1:{server.server_address[1]}", tok, template, hf, cfg
  finally:
    server.shutdown()
    server.server_close()

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
  ids = tok.encode(render_chatml(template, messages))
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
    expected = reference_greedy(hf, cfg, tok.encode(render_chatml(template, messages)), 8)
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
])
def test_bad_requests_get_json_errors(tiny_server, path, body, raw, status, fragment):
  url, *_ = tiny_server
  got, payload = request(url + path, body, raw)
  assert got == status and fragment in payload["error"]["message"]
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
