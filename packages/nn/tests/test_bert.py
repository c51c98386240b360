"""BERT: the WordPiece tokenizer against its rules (fast, a vocabulary built here), the encoder against torch on a tiny
random config, and (marked `model`) all-MiniLM-L6-v2 against the golden sentence-transformers values."""
from __future__ import annotations
import json
import math
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.nn.bert import BertConfig, BertModel, ModelFilesError, SentenceEmbedder, WordPieceTokenizer, cosine
from ember.nn.state import get_state_dict

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "hello", "world", ",", "!", "cafe", "的",
         "##s", "a"]

def test_wordpiece_rules():
  tok = WordPieceTokenizer(VOCAB)
  ids = {t: i for i, t in enumerate(VOCAB)}
  assert tok.tokenize("unaffable") == ["un", "##aff", "##able"]  # greedy longest match first
  assert tok.tokenize("Hello,WORLD!") == ["hello", ",", "world", "!"]  # lowercase, punctuation splits
  assert tok.tokenize("Café\t\u0000hello") == ["cafe", "hello"]  # accents stripped, control chars dropped
  assert tok.tokenize("a的a") == ["a", "的", "a"]  # CJK characters become words
  assert tok.tokenize("unknownword hellos") == ["[UNK]", "hello", "##s"]
  assert tok.tokenize("a" * 101) == ["[UNK]"]  # longer than max_chars_per_word
  assert tok.encode("hello world") == [ids["[CLS]"], ids["hello"], ids["world"], ids["[SEP]"]]
  assert tok.encode("hello world hello", max_length=4) == [ids["[CLS]"], ids["hello"], ids["world"], ids["[SEP]"]]
  with pytest.raises(ModelFilesError, match=r"\[SEP\]"): WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]"])

def _small_bert(layers: int, seed: int) -> tuple[BertModel, np.ndarray, np.ndarray]:
  """A 16-wide BertModel over VOCAB, and a padded batch of two sequences with its attention mask."""
  cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=layers, num_attention_heads=4,
                   intermediate_size=32, max_position_embeddings=12)
  Tensor.manual_seed(seed)
  ids = np.array([[2, 7, 8, 13, 3], [2, 4, 3, 0, 0]], dtype=np.int32)
  return BertModel(cfg), ids, (ids != 0).astype(np.float32)

def test_bert_encoder_matches_torch_with_padding():
  torch = pytest.importorskip("torch")
  model, ids, mask = _small_bert(layers=2, seed=0)
  mask[0, 3] = 1.0
  # the encoder is a precompiled ember.function: its first call traces, later calls of the shape replay the schedule
  got = model(Tensor(ids, dtype=dtypes.int32), Tensor(mask)).numpy()
  ids2 = np.array([[2, 13, 7, 3, 0], [2, 8, 8, 8, 3]], dtype=np.int32)
  for _ in range(2):
    got2 = model(Tensor(ids2, dtype=dtypes.int32), Tensor((ids2 != 0).astype(np.float32))).numpy()
  assert len(model._encode.traces) == 1 and next(iter(model._encode.traces.values())).replay is not None
  np.testing.assert_allclose(got, reference(torch, get_state_dict(model), ids, mask), atol=2e-5, rtol=1e-4)
  np.testing.assert_allclose(got2, reference(torch, get_state_dict(model), ids2, (ids2 != 0).astype(np.float32)),
                             atol=2e-5, rtol=1e-4)

def test_bert_replayed_encoder_trains_against_torch():
  torch = pytest.importorskip("torch")
  model, ids, mask = _small_bert(layers=1, seed=1)
  params = get_state_dict(model)
  sd = {k: torch.from_numpy(v.numpy()).requires_grad_(True) for k, v in params.items()}
  model(Tensor(ids, dtype=dtypes.int32), Tensor(mask)).realize()  # the trace (nothing requires grad yet)
  for p in params.values(): p.requires_grad = True
  for _ in range(2):  # replays, each with its backward
    for p in params.values(): p.grad = None
    out = model(Tensor(ids, dtype=dtypes.int32), Tensor(mask))
    (out * out.sin()).sum().backward()
  (trace,) = model._encode.traces.values()
  assert trace.backwards and all(b.replay is not None for b in trace.backwards.values())  # the backward replayed
  ref = reference(torch, sd, ids, mask)
  (ref * ref.sin()).sum().backward()
  for name in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight",
               "encoder.layer.0.output.LayerNorm.bias"):
    np.testing.assert_allclose(params[name].grad.numpy(), sd[name].grad.numpy(), atol=1e-4, rtol=1e-3, err_msg=name)

def reference(torch, sd, ids, mask):
  """The oracle: BERT written out in torch from the same weights (exact-erf GELU, post-LayerNorm blocks)."""
  sd = {k: torch.from_numpy(v.numpy()) if isinstance(v, Tensor) else v for k, v in sd.items()}
  layers = len({k.split(".")[2] for k in sd if k.startswith("encoder.layer.")})
  def ln(x, prefix):
    return torch.nn.functional.layer_norm(x, (16,), sd[prefix + ".weight"], sd[prefix + ".bias"], 1e-12)
  def lin(x, prefix): return x @ sd[prefix + ".weight"].T + sd[prefix + ".bias"]
  t_ids = torch.from_numpy(ids).long()
  x = sd["embeddings.word_embeddings.weight"][t_ids] + sd["embeddings.position_embeddings.weight"][:5]
  x = ln(x + sd["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
  bias = (1 - torch.from_numpy(mask))[:, None, None, :] * -1e9
  for i in range(layers):
    p = f"encoder.layer.{i}."
    def heads(t): return t.reshape(2, 5, 4, 4).transpose(1, 2)
    q, k, v = (heads(lin(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4) + bias, -1) @ v
    merged = att.transpose(1, 2).reshape(2, 5, 16)
    h = ln(lin(merged, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
    ff = torch.nn.functional.gelu(lin(h, p + "intermediate.dense"))
    x = ln(lin(ff, p + "output.dense") + h, p + "output.LayerNorm")
  return x

@pytest.mark.model
def test_a_symbolic_sequence_length_is_a_shape_error():
  # positions come from arange(seq): a bound Variable's length is refused by name, not by a TypeError in arange
  from ember import Variable
  from ember.errors import ShapeError
  cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                   intermediate_size=32, max_position_embeddings=16)
  ids = Tensor(np.zeros((1, 8), np.int32))[:, :Variable("t", 1, 8).bind(4)]
  with pytest.raises(ShapeError, match="concrete sequence length"): BertModel(cfg)(ids)

def test_minilm_matches_golden(golden):
  try: embedder = SentenceEmbedder.from_pretrained()
  except ModelFilesError as e: pytest.skip(str(e))
  ref = json.loads((golden / "all-minilm-l6-v2.json").read_text())
  cases = ref["cases"]
  hello = cases[0]
  assert embedder.tokenizer.encode(hello["text"]) == hello["input_ids"]
  hidden, _ = embedder.hidden([hello["text"]])
  np.testing.assert_allclose(hidden.numpy()[0, 0, :5], hello["cls_hidden_first5"], atol=1e-4)
  embeddings = embedder.encode([c["text"] for c in cases]).numpy()  # a padded batch of two
  for row, case in zip(embeddings, cases):
    np.testing.assert_allclose(row[:5], case["embedding_first5"], atol=1e-4, err_msg=case["text"])
    assert abs(np.linalg.norm(row) - 1) < 1e-5
  assert abs(cosine(embeddings[0], embeddings[1]) - ref["cosine_hello_world_vs_fox"]) < 1e-4

def test_sentence_batches_pad_to_a_multiple_of_16_without_changing_embeddings():
  # nearby lengths share one (B, T) signature of the precompiled encoder; the padding is masked out
  cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                   intermediate_size=32, max_position_embeddings=24)
  Tensor.manual_seed(2)
  embedder = SentenceEmbedder(BertModel(cfg), WordPieceTokenizer(VOCAB), max_seq_length=20)
  ids, mask, lists = embedder.batch(["hello world", "unaffable hello, world!"])
  assert ids.shape == (2, 16) and mask.numpy().sum(1).tolist() == [len(x) for x in lists] == [4, 9]
  assert embedder.batch(["hello " * 17])[0].shape == (1, 20)  # capped at max_seq_length
  got = embedder.encode(["hello world", "unaffable hello, world!"]).numpy()
  for row, seq in zip(got, lists):  # each text alone, unpadded, pooled in numpy
    hidden = embedder.model(Tensor(np.array([seq], np.int32), dtype=dtypes.int32)).numpy()[0].mean(0)
    np.testing.assert_allclose(row, hidden / np.linalg.norm(hidden), rtol=1e-4, atol=1e-5)
