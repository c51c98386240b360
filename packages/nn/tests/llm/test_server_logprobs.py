"""logprobs / top_logprobs of the OpenAI-compatible server against the numpy oracle: a float64 log-softmax of the
reference model's logits at every generated position (the raw logits, whatever the temperature), in completions'
and chat's shapes, streamed and not."""
from __future__ import annotations
import json
import threading
import urllib.request
from typing import Any, Iterator
import numpy as np
import pytest
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import Llama
from ember.nn.llm.server import LLMService, make_server
from ember.nn.llm.tokenizer import BPETokenizer

TOL = 1e-3  # the model runs in float32, the oracle in float64

@pytest.fixture(scope="module")
def server(tiny_llama_module) -> Iterator[tuple[str, BPETokenizer, LLMService, dict[str, np.ndarray], dict]]:
  path, hf, cfg = tiny_llama_module
  f = GGUFFile(path)
  tok = BPETokenizer.from_gguf_metadata(f.metadata)
  service = LLMService(Llama.from_gguf(f, max_context=48), tok, f.metadata["tokenizer.chat_template"], "tiny")
  http = make_server(service, port=0)
  threading.Thread(target=http.serve_forever, daemon=True).start()
  try: yield f"http://127.0.0.1:{http.server_address[1]}", tok, service, hf, cfg
  finally:
    http.shutdown()
    http.server_close()

def post(url: str, body: dict[str, Any]) -> Any:
  req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=60) as resp:
    raw = resp.read().decode()
  if not body.get("stream"): return json.loads(raw)
  return [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]

def oracle_logprobs(reference_logits, hf, cfg, prompt: list[int], generated: list[int]) -> np.ndarray:
  """(len(generated), vocab): the log-softmax of the reference logits that each generated token was drawn from."""
  logits = reference_logits(hf, cfg, prompt + generated)[len(prompt) - 1:len(prompt) - 1 + len(generated)]
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

def ids_of(tok: BPETokenizer, entries: list[dict[str, Any]]) -> list[int]:
  """Token ids of chat logprob entries, found from their bytes (every token of the tiny vocabulary has its own)."""
  by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
  assert len(by_bytes) == tok.vocab_size
  return [by_bytes[bytes(e["bytes"])] for e in entries]

def check_chat_entries(tok, entries, expected: np.ndarray, top: int) -> None:
  ids = ids_of(tok, entries)
  for entry, token, row in zip(entries, ids, expected):
    assert entry["token"] == tok.token_bytes(token).decode("utf-8", errors="replace")
    assert entry["logprob"] == pytest.approx(row[token], abs=TOL)
    # the top alternatives: the `top` largest log probabilities, most likely first, each the oracle's for its token
    alternatives = ids_of(tok, entry["top_logprobs"])
    assert len(alternatives) == top
    got = [e["logprob"] for e in entry["top_logprobs"]]
    np.testing.assert_allclose(got, np.sort(row)[::-1][:top], atol=TOL)
    np.testing.assert_allclose(got, row[alternatives], atol=TOL)

@pytest.mark.parametrize("temperature, seed", [(0, None), (1.5, 5)])
def test_chat_logprobs_match_the_oracle(server, reference_logits, temperature, seed):
  # sampled tokens carry the log probabilities of the model's logits, not of the temperature-scaled ones
  url, tok, service, hf, cfg = server
  messages = [{"role": "user", "content": "the tin"}]
  body = {"messages": messages, "max_tokens": 8, "temperature": temperature, "seed": seed, "logprobs": True,
          "top_logprobs": 3}
  reply = post(url + "/v1/chat/completions", body)
  choice = reply["choices"][0]
  entries = choice["logprobs"]["content"]
  generated = ids_of(tok, entries)
  assert tok.decode(generated) == choice["message"]["content"] and choice["logprobs"]["refusal"] is None
  # every token but an end of turn (the usage counts it) has an entry
  assert reply["usage"]["completion_tokens"] == len(entries) + (choice["finish_reason"] == "stop")
  prompt = service.parse("chat", {"messages": messages}).prompt_ids  # rendered with the model's chat template
  check_chat_entries(tok, entries, oracle_logprobs(reference_logits, hf, cfg, prompt, generated), 3)

def test_chat_logprobs_without_top_logprobs_have_no_alternatives(server):
  url, *_ = server
  reply = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "temperature": 0, "logprobs": True})
  entries = reply["choices"][0]["logprobs"]["content"]
  assert entries and all(e["top_logprobs"] == [] for e in entries)
  plain = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "temperature": 0})
  assert plain["choices"][0]["logprobs"] is None

def test_completion_logprobs_match_the_oracle(server, reference_logits):
  url, tok, _, hf, cfg = server
  prompt = tok.encode(" a hat")
  reply = post(url + "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2})
  choice = reply["choices"][0]
  logprobs = choice["logprobs"]
  generated = []
  for _ in range(6):  # the oracle's greedy tokens
    generated.append(int(np.argmax(reference_logits(hf, cfg, prompt + generated)[-1])))
  expected = oracle_logprobs(reference_logits, hf, cfg, prompt, generated)
  assert logprobs["tokens"] == [tok.token_bytes(t).decode("utf-8", errors="replace") for t in generated]
  np.testing.assert_allclose(logprobs["token_logprobs"], expected[np.arange(6), generated], atol=TOL)
  for alternatives, row in zip(logprobs["top_logprobs"], expected):
    best = np.argsort(-row, kind="stable")[:2]
    assert set(alternatives) <= {tok.token_bytes(int(i)).decode("utf-8", errors="replace") for i in best}
    np.testing.assert_allclose(sorted(alternatives.values(), reverse=True), row[best], atol=TOL)
  assert logprobs["text_offset"] == np.cumsum([0] + [len(t) for t in logprobs["tokens"][:-1]]).tolist()

@pytest.mark.parametrize("path, body", [
  ("/v1/completions", {"prompt": " the", "logprobs": 3}),
  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a hat in"}], "logprobs": True,
                            "top_logprobs": 2}),
  ("/v1/completions", {"prompt": " the", "logprobs": 1, "stop": ["e the", "he t"]}),
])
def test_streamed_logprobs_equal_the_plain_reply(server, path, body):
  # the chunks carry the log probabilities of the tokens generated since the previous chunk, the last one the rest
  url, *_ = server
  body = {**body, "max_tokens": 10, "temperature": 0}
  plain = post(url + path, body)["choices"][0]["logprobs"]
  events = post(url + path, {**body, "stream": True})
  parts = [e["choices"][0]["logprobs"] for e in events if e["choices"][0].get("logprobs") is not None]
  if path == "/v1/completions":
    joined = {key: [v for part in parts for v in part[key]] for key in ("tokens", "token_logprobs", "top_logprobs")}
    assert joined == {key: plain[key] for key in joined} and plain["tokens"]
  else:
    assert [entry for part in parts for entry in part["content"]] == plain["content"] and plain["content"]
