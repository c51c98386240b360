"""The server driven by the official `openai` Python client (a test dependency): completions, chat, streaming with
usage, stop strings, n, the model list and error bodies, against the tiny random model and its numpy reference."""
from __future__ import annotations
import threading
from typing import Any, Iterator
import numpy as np
import pytest
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import Llama
from ember.nn.llm.server import LLMService, make_server
from ember.nn.llm.tokenizer import BPETokenizer, render_chat

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install openai")

@pytest.fixture(scope="module")
def client(tiny_llama_module) -> Iterator[tuple[Any, BPETokenizer, str]]:
  path, _, _ = tiny_llama_module
  f = GGUFFile(path)
  tok = BPETokenizer.from_gguf_metadata(f.metadata)
  template = f.metadata["tokenizer.chat_template"]
  server = make_server(LLMService(Llama.from_gguf(f, max_context=48), tok, template, "tiny"), port=0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused",
                        max_retries=0, timeout=60), tok, template
  finally:
    server.shutdown()
    server.server_close()

@pytest.fixture(scope="module")
def greedy_text(tiny_llama_module, reference_logits):
  _, hf, cfg = tiny_llama_module
  def text(tok: BPETokenizer, ids: list[int], n: int) -> str:
    ids = list(ids)
    for _ in range(n): ids.append(int(np.argmax(reference_logits(hf, cfg, ids)[-1])))
    return tok.decode([t for t in ids[-n:] if t not in tok.stop_ids])
  return text

def test_models(client):
  api, *_ = client
  assert [m.id for m in api.models.list()] == ["tiny"] and api.models.retrieve("tiny").id == "tiny"

def test_completion(client, greedy_text):
  api, tok, _ = client
  reply = api.completions.create(model="tiny", prompt=" the", max_tokens=4, temperature=0, seed=1)
  assert reply.choices[0].text == greedy_text(tok, tok.encode(" the"), 4)
  assert reply.usage.completion_tokens == 4 and reply.usage.prompt_tokens == len(tok.encode(" the"))

def test_chat_n_choices(client, greedy_text):
  api, tok, template = client
  messages = [{"role": "user", "content": "hi"}]
  reply = api.chat.completions.create(model="tiny", messages=messages, max_tokens=3, temperature=0, n=2)
  expected = greedy_text(tok, tok.encode(render_chat(template, messages)), 3)
  assert [c.message.content for c in reply.choices] == [expected, expected]

def test_chat_stream_with_usage_and_stop(client, greedy_text):
  api, tok, template = client
  messages = [{"role": "user", "content": "the tin"}]
  full = greedy_text(tok, tok.encode(render_chat(template, messages)), 8)
  stop = full[3:5]
  chunks = list(api.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, stop=[stop],
                                            stream=True, stream_options={"include_usage": True}))
  text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert text == full[:full.find(stop)] and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 8

@pytest.mark.parametrize("kwargs, error, fragment", [
  ({"temperature": 5}, "BadRequestError", "'temperature' must be a finite number in [0, 2]"),
  ({"seed": -1}, "BadRequestError", "'seed'"),
  ({"n": 0}, "BadRequestError", "'n'"),
  ({"model": "gpt-4"}, "NotFoundError", "does not exist"),
])
def test_errors_reach_the_client(client, kwargs, error, fragment):
  api, *_ = client
  with pytest.raises(getattr(openai, error)) as info:
    api.completions.create(**{"model": "tiny", "prompt": "x", "max_tokens": 1, **kwargs})
  assert fragment in info.value.message and info.value.body["type"] == "invalid_request_error"

def test_logprobs_parse_in_the_client(client, greedy_text):
  # the client's types accept both endpoints' shapes; greedy tokens are each position's most likely one
  api, tok, template = client
  messages = [{"role": "user", "content": "a hat"}]
  chat = api.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                     top_logprobs=2)
  content = chat.choices[0].logprobs.content
  assert "".join(e.token for e in content) == greedy_text(tok, tok.encode(render_chat(template, messages)), 4)
  assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob <= 0 for e in content)
  assert all(e.top_logprobs[0].bytes == e.bytes for e in content)
  completion = api.completions.create(model="tiny", prompt=" the", max_tokens=4, temperature=0, logprobs=2)
  logprobs = completion.choices[0].logprobs
  assert "".join(logprobs.tokens) == completion.choices[0].text and len(logprobs.token_logprobs) == 4
  assert all(max(top.values()) == lp for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs))
