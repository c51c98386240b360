"""GPT-2 style byte-level BPE built from GGUF metadata (`tokenizer.ggml.model == "gpt2"`), with special tokens.

Encoding: special tokens (control and user-defined entries of the vocabulary) are cut out first; the text between
them is pre-tokenized (GPT-2; SmolLM/StarCoder: every digit alone, then the GPT-2 pattern; Llama 3; Qwen2), each
piece's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and merged by BPE rank.
Decoding maps the characters back to bytes and decodes UTF-8 with errors="replace", so any token sequence decodes
without raising.

The pre-tokenizers are hand-written: their patterns need `\\p{L}` and `\\p{N}`, which `re` lacks, so the splitters
walk the string with explicit unicode-category checks (`\\s` is Unicode White_Space, as in the `regex` module and
Oniguruma, which excludes the separators U+001C..U+001F that `str.isspace` accepts). Each implements its pattern's
alternatives in order of preference at each position:

- GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`
- Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|`
  `\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`
- Qwen2: the Llama 3 pattern with `\\p{N}` (one number character) instead of `\\p{N}{1,3}`
"""
from __future__ import annotations
import codecs
import functools
import unicodedata
from typing import Any, Iterable, TypedDict
from ember.errors import EmberError

class TokenizerError(EmberError, ValueError):
  """The GGUF tokenizer metadata is missing, inconsistent or of an unsupported kind."""

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# pre-tokenizers (tokenizer.ggml.pre) that split digits one by one before the GPT-2 pattern
DIGIT_SPLITTING_PRE = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
GPT2_PRE = frozenset({"gpt2", "default", "gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "olmo",
                      "poro-chat"})
# pre-tokenizers with the Llama 3 pattern (numbers in runs of up to 3), and with the Qwen2 one (numbers one by one)
LLAMA3_PRE = frozenset({"llama-bpe", "llama3", "llama-v3"})
QWEN2_PRE = frozenset({"qwen2", "deepseek-r1-qwen"})
SUPPORTED_PRE = DIGIT_SPLITTING_PRE | GPT2_PRE | LLAMA3_PRE | QWEN2_PRE
END_OF_TURN_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>")
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")

@functools.cache
def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map of the 256 byte values to printable characters: printable latin-1 bytes map to
  themselves, the rest to code points 256, 257, ... in byte order."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  out: dict[int, str] = {b: chr(b) for b in keep}
  extra = 0
  for b in range(256):
    if b not in out:
      out[b] = chr(256 + extra)
      extra += 1
  return out

@functools.cache
def unicode_to_bytes() -> dict[str, int]: return {c: b for b, c in bytes_to_unicode().items()}

@functools.cache
def _is_letter(ch: str) -> bool: return unicodedata.category(ch)[0] == "L"
@functools.cache
def _is_number(ch: str) -> bool: return unicodedata.category(ch)[0] == "N"
# \s is Unicode White_Space, which excludes the information separators U+001C..U+001F that str.isspace accepts
def _is_space(ch: str) -> bool: return ch.isspace() and not "\x1c" <= ch <= "\x1f"
def _is_other(ch: str) -> bool: return not (_is_space(ch) or _is_letter(ch) or _is_number(ch))
def _is_newline(ch: str) -> bool: return ch in "\r\n"

def _run(text: str, i: int, pred: Any) -> int:
  """The end of the run of characters satisfying `pred` that starts at i."""
  n = len(text)
  while i < n and pred(text[i]): i += 1
  return i

def split_gpt2(text: str) -> list[str]:
  """Split `text` as the GPT-2 pre-tokenizer pattern does (see the module docstring)."""
  out: list[str] = []
  i, n = 0, len(text)
  while i < n:
    ch = text[i]
    if ch == "'":
      hit = next((c for c in CONTRACTIONS if text.startswith(c, i)), None)
      if hit is not None:
        out.append(hit)
        i += len(hit)
        continue
    # an optional single leading space glues onto a letter, number or punctuation run
    start, j = i, i + 1 if ch == " " and i + 1 < n else i
    head = text[j]
    if j == i and _is_space(ch):
      end = _run(text, i, _is_space)
      # \s+(?!\S): keep the last whitespace for the next token when a non-space follows, unless it is the only one
      if end < n and end - i > 1: end -= 1
      out.append(text[i:end])
      i = end
      continue
    for pred in (_is_letter, _is_number, _is_other):
      if pred(head):
        end = _run(text, j, pred)
        out.append(text[start:end])
        i = end
        break
    else:  # a space followed by whitespace: part of a whitespace run
      end = _run(text, i, _is_space)
      if end < n and end - i > 1: end -= 1
      out.append(text[i:end])
      i = end
  return out

def _contraction_at(text: str, i: int) -> str | None:
  """The contraction ('s, 't, 're, 've, 'm, 'll, 'd in any case, by simple case folding: "'ſ" is one too) at i."""
  for c in CONTRACTIONS:
    piece = text[i:i + len(c)]
    if len(piece) == len(c) and piece[0] == "'" and all(a.casefold() == b for a, b in zip(piece[1:], c[1:])):
      return piece
  return None

def _whitespace_end(text: str, i: int) -> int:
  """The end of the whitespace token at i (a whitespace character): `\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`."""
  end = _run(text, i, _is_space)
  # \s*[\r\n]+: up to and including the run's last line break
  last_newline = next((k for k in range(end - 1, i - 1, -1) if _is_newline(text[k])), None)
  if last_newline is not None: return last_newline + 1
  # \s+(?!\S): keep the last whitespace for the next token when a non-space follows, unless it is the only one
  return end - 1 if end < len(text) and end - i > 1 else end

def split_llama3(text: str, max_digits: int = 3) -> list[str]:
  """Split `text` as the Llama 3 pre-tokenizer pattern does (numbers in runs of up to `max_digits`); with
  `max_digits=1`, as Qwen2's does (see the module docstring)."""
  if max_digits < 1: raise TokenizerError(f"max_digits must be at least 1, got {max_digits}")
  out: list[str] = []
  i, n = 0, len(text)
  while i < n:
    ch = text[i]
    if ch == "'" and (hit := _contraction_at(text, i)) is not None: end = i + len(hit)
    # [^\r\n\p{L}\p{N}]?\p{L}+: one character that is not a line break, letter or number may lead a letter run
    elif _is_letter(ch): end = _run(text, i, _is_letter)
    elif i + 1 < n and _is_letter(text[i + 1]) and not (_is_newline(ch) or _is_number(ch)):
      end = _run(text, i + 1, _is_letter)
    elif _is_number(ch): end = min(_run(text, i, _is_number), i + max_digits)
    # ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation, symbols and emoji, optionally after one space, with trailing breaks
    elif _is_other(ch) or (ch == " " and i + 1 < n and _is_other(text[i + 1])):
      end = _run(text, _run(text, i + 1, _is_other), _is_newline)
    else: end = _whitespace_end(text, i)
    out.append(text[i:end])
    i = end
  return out

def split_digits(text: str) -> list[str]:
  """Every number character alone, the text between them kept whole (HF `Digits(individual_digits=True)`)."""
  out: list[str] = []
  last = 0
  for i, ch in enumerate(text):
    if _is_number(ch):
      if last < i: out.append(text[last:i])
      out.append(ch)
      last = i + 1
  if last < len(text): out.append(text[last:])
  return out

class BPETokenizer:
  """Byte-level BPE: `encode(text) -> ids`, `decode(ids) -> text`, with the vocabulary's special tokens.

  >>> tok = BPETokenizer.from_gguf_metadata(gguf.metadata)  # doctest: +SKIP
  >>> tok.decode(tok.encode("Once upon a time"))  # doctest: +SKIP
  'Once upon a time'
  """
  def __init__(self, tokens: list[str], merges: list[str], token_types: list[int] | None = None, pre: str = "gpt2",
               bos_id: int | None = None, eos_id: int | None = None, add_bos: bool = False,
               eot_ids: Iterable[int] = ()):
    if pre not in SUPPORTED_PRE:
      raise TokenizerError(f"pre-tokenizer (tokenizer.ggml.pre) {pre!r} is not supported; supported: "
        f"{sorted(SUPPORTED_PRE)}")
    self.tokens = list(tokens)
    self.token_types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
    if len(self.token_types) != len(self.tokens):
      raise TokenizerError(f"token_type has {len(self.token_types)} entries but the vocabulary has "
        f"{len(self.tokens)} tokens")
    self.vocab: dict[str, int] = {}
    for i, t in enumerate(self.tokens): self.vocab.setdefault(t, i)
    self.ranks: dict[tuple[str, str], int] = {}
    for rank, m in enumerate(merges):
      left, sep, right = m.partition(" ")
      if not sep: raise TokenizerError(f"BPE merge #{rank} {m!r} is not two symbols separated by a space")
      self.ranks.setdefault((left, right), rank)
    self.pre, self.bos_id, self.eos_id, self.add_bos = pre, bos_id, eos_id, add_bos
    special_types = (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    self.special = {t: i for i, t in enumerate(self.tokens) if self.token_types[i] in special_types and t}
    # longest first, so "<|im_start|>" wins over any special token that is its prefix
    self._special_sorted = sorted(self.special, key=len, reverse=True)
    self._special_first = {t[0] for t in self.special}
    self.stop_ids = frozenset({*(i for i in (eos_id,) if i is not None), *eot_ids,
                               *(self.vocab[n] for n in END_OF_TURN_NAMES if n in self.vocab)})
    self._b2u, self._u2b = bytes_to_unicode(), unicode_to_bytes()
    self._cache: dict[str, tuple[int, ...]] = {}

  @classmethod
  def from_gguf_metadata(cls, md: dict[str, Any]) -> BPETokenizer:
    model = md.get("tokenizer.ggml.model")
    if model != "gpt2":
      raise TokenizerError(f"tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') vocabularies are "
        f"supported")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
      if key not in md: raise TokenizerError(f"GGUF metadata lacks {key!r}, which a byte-level BPE tokenizer needs")
    eot = md.get("tokenizer.ggml.eot_token_id")
    return cls(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"], md.get("tokenizer.ggml.token_type"),
               pre=md.get("tokenizer.ggml.pre", "gpt2"), bos_id=md.get("tokenizer.ggml.bos_token_id"),
               eos_id=md.get("tokenizer.ggml.eos_token_id"),
               add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
               eot_ids=() if eot is None else (int(eot),))

  @property
  def vocab_size(self) -> int: return len(self.tokens)

  # ** encode **
  def encode(self, text: str, special: bool = True, add_bos: bool | None = None) -> list[int]:
    """Token ids of `text`. With `special`, special-token strings in the text become their ids; otherwise they are
    encoded as plain text. BOS is prepended when `add_bos` (default: the GGUF's add_bos_token) and a BOS exists."""
    ids: list[int] = []
    if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None: ids.append(self.bos_id)
    for piece, special_id in self._split_special(text) if special else [(text, None)]:
      if special_id is not None: ids.append(special_id)
      else:
        for word in self._pretokenize(piece): ids.extend(self._bpe_word(word))
    return ids

  def _split_special(self, text: str) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    last, i, n = 0, 0, len(text)
    while i < n:
      if text[i] in self._special_first:
        hit = next((s for s in self._special_sorted if text.startswith(s, i)), None)
        if hit is not None:
          if last < i: out.append((text[last:i], None))
          out.append((hit, self.special[hit]))
          i = last = i + len(hit)
          continue
      i += 1
    if last < n: out.append((text[last:], None))
    return out

  def _pretokenize(self, text: str) -> list[str]:
    if self.pre in DIGIT_SPLITTING_PRE: return [w for part in split_digits(text) for w in split_gpt2(part)]
    if self.pre in LLAMA3_PRE: return split_llama3(text)
    if self.pre in QWEN2_PRE: return split_llama3(text, max_digits=1)
    return split_gpt2(text)

  def _bpe_word(self, word: str) -> tuple[int, ...]:
    if (hit := self._cache.get(word)) is not None: return hit
    symbols = [self._b2u[b] for b in word.encode("utf-8")]
    while len(symbols) > 1:
      best_rank, best_pair = None, None
      for pair in zip(symbols, symbols[1:]):
        rank = self.ranks.get(pair)
        if rank is not None and (best_rank is None or rank < best_rank): best_rank, best_pair = rank, pair
      if best_pair is None: break
      merged: list[str] = []
      k = 0
      while k < len(symbols):
        if k + 1 < len(symbols) and (symbols[k], symbols[k + 1]) == best_pair:
          merged.append(symbols[k] + symbols[k + 1])
          k += 2
        else:
          merged.append(symbols[k])
          k += 1
      symbols = merged
    ids: list[int] = []
    for s in symbols:
      if s in self.vocab: ids.append(self.vocab[s])
      else:  # a merge result missing from the vocabulary: fall back to its single bytes
        for c in s:
          if c not in self.vocab: raise TokenizerError(f"byte symbol {c!r} of word {word!r} is not in the "
            f"vocabulary; the GGUF vocabulary is incomplete")
          ids.append(self.vocab[c])
    out = tuple(ids)
    if len(self._cache) < 100_000: self._cache[word] = out
    return out

  # ** decode **
  def token_bytes(self, token_id: int) -> bytes:
    """The bytes token `token_id` stands for (special tokens: their text in UTF-8)."""
    if not 0 <= token_id < len(self.tokens): raise TokenizerError(f"token id {token_id} is outside the vocabulary "
      f"(size {len(self.tokens)})")
    text = self.tokens[token_id]
    if self.token_types[token_id] in (TOKEN_CONTROL, TOKEN_USER_DEFINED): return text.encode("utf-8")
    # characters outside the byte table (only in malformed vocabularies) pass through as their UTF-8
    return b"".join(bytes((self._u2b[c],)) if c in self._u2b else c.encode("utf-8") for c in text)

  def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
    """Text of `ids`; incomplete or invalid UTF-8 becomes U+FFFD."""
    keep = [i for i in ids if not (skip_special and i in self.special.values())]
    return b"".join(self.token_bytes(int(i)) for i in keep).decode("utf-8", errors="replace")

  def stream_decoder(self) -> StreamDecoder: return StreamDecoder(self)

class StreamDecoder:
  """Incremental decoding for streaming: `push(id)` returns the text that became complete (a multi-byte character
  split across tokens is held back until its last byte arrives); `flush()` returns what is left."""
  def __init__(self, tokenizer: BPETokenizer):
    self.tokenizer = tokenizer
    self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  def push(self, token_id: int) -> str: return self.decoder.decode(self.tokenizer.token_bytes(token_id))
  def flush(self) -> str: return self.decoder.decode(b"", final=True)

# ** chat templates **

CHATML_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>\\n' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

def _raise_exception(message: str) -> None:
  raise TokenizerError(f"the chat template refused the conversation: {message}")

@functools.lru_cache(maxsize=8)
def _compile_template(source: str) -> Any:
  try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:
    raise TokenizerError("chat templates are rendered with Jinja2, which is not installed; install ember-nn[llm] "
                         "(or `pip install jinja2`)") from e
  # as transformers renders them: blocks trimmed, a sandbox, raise_exception and tojson available
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.globals["raise_exception"] = _raise_exception
  try: return env.from_string(source)
  except jinja2.TemplateError as e: raise TokenizerError(f"the model's chat template is not valid Jinja: {e}") from e

def render_chat(template: str | None, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
  """Render `messages` ({"role", "content"} dicts) with the model's chat template (the GGUF's
  `tokenizer.chat_template`, Jinja2, rendered as transformers renders it); ChatML when the file has none.

  >>> render_chat(None, [{"role": "user", "content": "Hi"}])
  '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
  """
  for m in messages:
    if "role" not in m or "content" not in m: raise TokenizerError(f"chat message {m!r} needs 'role' and 'content'")
  compiled = _compile_template(template if template is not None else CHATML_TEMPLATE)
  import jinja2
  try:
    return str(compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                               eos_token=eos_token))
  except jinja2.TemplateError as e: raise TokenizerError(f"the model's chat template failed to render: {e}") from e

class SpecialTokens(TypedDict):
  bos_token: str
  eos_token: str

def special_tokens(tokenizer: BPETokenizer) -> SpecialTokens:
  """The BOS/EOS strings a chat template may use (`bos_token`, `eos_token`), as keyword arguments of render_chat."""
  def text(i: int | None) -> str: return tokenizer.tokens[i] if i is not None and 0 <= i < tokenizer.vocab_size else ""
  return SpecialTokens(bos_token=text(tokenizer.bos_id), eos_token=text(tokenizer.eos_id))
