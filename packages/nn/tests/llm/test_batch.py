"""Continuous batching (ember.nn.llm.batch): concurrent greedy requests decode in shared steps and reply exactly what
they reply alone, against the numpy oracle of the architecture."""
from __future__ import annotations
import threading
import numpy as np
import pytest
from ember.nn.llm.batch import BatchEngine
from ember.nn.llm.generate import generate
from ember.nn.llm.model import ContextOverflowError, Llama

PROMPTS = [[5, 77, 200], [9, 8, 7, 6, 5], [42], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]

def _greedy_reference(reference_logits, hf, cfg, prompt: list[int], n: int) -> list[int]:
  ids = list(prompt)
  for _ in range(n): ids.append(int(np.argmax(reference_logits(hf, cfg, ids)[-1])))
  return ids[len(prompt):]

def test_four_concurrent_greedy_requests_equal_their_single_replies(tiny_llama, reference_logits):
  path, hf, cfg = tiny_llama
  model = Llama.from_gguf(path, max_context=32)
  engine = BatchEngine(model, 4)
  try:
    alone = []
    for prompt in PROMPTS:
      engine.sessions[0].reset()
      alone.append(generate(engine.sessions[0], prompt, 8))
    assert alone == [_greedy_reference(reference_logits, hf, cfg, p, 8) for p in PROMPTS]
    replies: list[list[int]] = [[] for _ in PROMPTS]
    def client(i: int) -> None:
      engine.sessions[i].reset()
      replies[i] = generate(engine.sessions[i], PROMPTS[i], 8)
    before = engine.steps
    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert replies == alone
    assert engine.steps - before < 4 * 7  # the 28 decode tokens shared steps
  finally: engine.close()

def test_an_error_reaches_only_its_request(tiny_llama):
  path, _, _ = tiny_llama
  model = Llama.from_gguf(path, max_context=8)
  engine = BatchEngine(model, 2)
  try:
    with pytest.raises(ContextOverflowError, match="max_context 8"): engine.sessions[0].forward(list(range(9)))
    engine.sessions[1].reset()
    assert len(generate(engine.sessions[1], [5, 6], 3)) == 3
  finally: engine.close()
