"""The byte-level BPE tokenizer: the hand-written pre-tokenizers against the `regex` module running the GPT-2,
Llama 3 and Qwen2 patterns, BPE merges by rank, special tokens, UTF-8 round trips and streaming decode."""
from __future__ import annotations
import numpy as np
import pytest
from ember.nn.llm.tokenizer import (BPETokenizer, TokenizerError, bytes_to_unicode, render_chat, split_digits,
                                    split_gpt2, split_llama3)

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TEXTS = ["Once upon a time", "Hello,  world!\n\n  indented\tline  ", "it's they're I'll we've 'quoted' don't",
         "café naïve Ünïcödé façade", "東京は日本の首都です。", "emoji 🙂👍🏽 and 👨‍👩‍👧 family",
         "x = 3.14159 + 42;  // ½ ², ³",
         "   leading and trailing   ", "a\u00a0b\u2003c", "tabs\t\tand\r\nnewlines\n", "!!!???...", "' s '", "",
         "a\x1c\x1cb \x1f\x1e"]  # U+001C..U+001F are not \s (White_Space), though str.isspace accepts them
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
# Llama 3 / Qwen2 corpus: contractions in any case (with U+017F, which simple case folding maps to s), digit runs of
# 1 to 7, letters and numbers of several scripts, emoji, CJK, whitespace and line breaks in every arrangement
SPLIT_CORPUS = TEXTS + [
  "IT'S They'Re I'LL we'VE she'D I'm YOU'Ll 'Sx 'ſ 'ſx it'ſx IT'Sx 's's ''s x'",
  "1 12 123 1234 12345 123456 1234567 v2.0.10",
  "٣٤٥٦ १२३४५ ⅫⅣ ①②③④ ½¾ 3²", "Привет, мир! Ελληνικά עברית مرحبا हिन्दी ไทย 한국어", "東京タワー333m、2024年。",
  "🙂🙂 x🙂y 🙂\n 👍🏽!", "\n\n\nx \n \n  y\r\n\r\nz\t\n\tw", "trailing spaces   ", "trailing tab\t",
  "line\n", "a  \n", "!!\n\n  ?? \n", " !x  .y\t,z\u3000w", "\u2028\u2029\x85x\x0b\x0cy", "tab\tword\t\tword",
  "x\r\ry\r", " 1 22  333", "'\n's", "don't\nDON'T", "a\u00a0\u00a0b \u00a0 1"]

def _assigned_text(hypothesis_module):
  """Text from assigned code points (`regex` may know a newer Unicode than unicodedata, so the two disagree only on
  characters unassigned in Python's database), mixed with pieces that exercise every alternative of the patterns."""
  st = hypothesis_module.strategies
  pieces = st.sampled_from(["'s", "'LL", "'Re", "'ſ", " ", "  ", "\n", "\r\n", "\t", "\u00a0", "1234567", "٣٤",
                            "½", "東京", "🙂", "!?", " .", "x", "É", "\x1c"])
  chars = st.text(st.characters(exclude_categories=("Cn", "Cs")), max_size=6)
  return st.lists(st.one_of(pieces, chars), max_size=12).map("".join)

@pytest.mark.parametrize("text", TEXTS)
def test_split_gpt2_matches_regex(text):
  regex = pytest.importorskip("regex")
  assert split_gpt2(text) == regex.findall(GPT2_PATTERN, text)

def test_split_gpt2_random_unicode_matches_regex():
  regex = pytest.importorskip("regex")
  rng = np.random.default_rng(0)
  alphabet = list("ab Z9'  \n\t.,!é東🙂½\u00a0-") + ["'s", "'ll", "  "]
  for _ in range(300):
    text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 20))))
    assert split_gpt2(text) == regex.findall(GPT2_PATTERN, text), repr(text)

@pytest.mark.parametrize("text", SPLIT_CORPUS)
def test_split_llama3_and_qwen2_match_regex(text):
  regex = pytest.importorskip("regex")
  assert split_llama3(text) == regex.findall(LLAMA3_PATTERN, text)
  assert split_llama3(text, max_digits=1) == regex.findall(QWEN2_PATTERN, text)

def test_split_hypothesis_text_matches_regex():
  regex = pytest.importorskip("regex")
  hypothesis = pytest.importorskip("hypothesis")

  @hypothesis.settings(max_examples=300, deadline=None, derandomize=True, database=None)
  @hypothesis.given(_assigned_text(hypothesis))
  def check(text: str) -> None:
    assert split_llama3(text) == regex.findall(LLAMA3_PATTERN, text)
    assert split_llama3(text, max_digits=1) == regex.findall(QWEN2_PATTERN, text)
    assert split_gpt2(text) == regex.findall(GPT2_PATTERN, text)
  check()

def test_split_llama3_rejects_bad_max_digits():
  with pytest.raises(TokenizerError, match="max_digits must be at least 1"): split_llama3("12", max_digits=0)

def _byte_level_tokenizer(pre: str) -> BPETokenizer:
  """A byte vocabulary whose merges would fuse any run of 1s (the pre-tokenizer alone decides where numbers break)
  and " the"."""
  tokens = [bytes_to_unicode()[b] for b in range(256)] + ["11", "111", "1111", "Ġ1", "Ġt", "he", "Ġthe"]
  merges = ["1 1", "11 1", "11 11", "111 1", "Ġ 1", "Ġ t", "h e", "Ġt he"]
  return BPETokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges})

# " 111": Llama 3 and Qwen2 keep the space apart from numbers, GPT-2 glues it on (and BPE merges "1 1" first)
@pytest.mark.parametrize("pre, pieces", [("llama-bpe", ["111", "1", "Ġ", "111"]), ("llama3", ["111", "1", "Ġ", "111"]),
                                         ("qwen2", ["1", "1", "1", "1", "Ġ", "1", "1", "1"]),
                                         ("gpt2", ["1111", "Ġ", "111"])])
def test_pre_tokenizer_decides_number_pieces(pre, pieces):
  tok = _byte_level_tokenizer(pre)
  ids = tok.encode("1111 111")
  assert [tok.tokens[i] for i in ids] == pieces and tok.decode(ids) == "1111 111"

@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
@pytest.mark.parametrize("text", SPLIT_CORPUS)
def test_round_trip_llama3_qwen2(pre, text):
  tok = _byte_level_tokenizer(pre)
  assert tok.decode(tok.encode(text)) == text

def test_split_digits():
  assert split_digits("ab12 c3") == ["ab", "1", "2", " c", "3"]
  assert split_digits("²x") == ["²", "x"]

def test_bpe_merges_by_rank(byte_tokenizer):
  tok = byte_tokenizer
  # merges: "Ġ t" (0), "h e" (1), "Ġt he" (2), "i n" (3), "Ġ a" (4): " the" -> Ġt + he -> Ġthe
  assert tok.encode(" the") == [tok.vocab["Ġthe"]]
  assert tok.encode(" then") == [tok.vocab["Ġthe"], tok.vocab["n"]]
  assert tok.encode("inin") == [tok.vocab["in"], tok.vocab["in"]]
  assert tok.encode(" a") == [tok.vocab["Ġa"]]
  assert tok.encode("ab") == [tok.vocab["a"], tok.vocab["b"]]

def test_special_tokens(byte_tokenizer):
  tok = byte_tokenizer
  ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
  assert ids[0] == 1 and ids[-1] == 2
  assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
  plain = tok.encode("<|im_end|>", special=False)
  assert 2 not in plain and tok.decode(plain) == "<|im_end|>"
  assert tok.encode("hi", add_bos=True)[0] == 1
  assert 2 in tok.stop_ids and 0 in tok.stop_ids  # eos and <|endoftext|>

@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_byte_vocab(byte_tokenizer, text):
  assert byte_tokenizer.decode(byte_tokenizer.encode(text)) == text

def test_decode_invalid_utf8_replaces(byte_tokenizer):
  tok = byte_tokenizer
  emoji = "🙂".encode("utf-8")
  byte_ids = [tok.vocab[bytes_to_unicode()[b]] for b in emoji]
  assert tok.decode(byte_ids) == "🙂"
  assert tok.decode(byte_ids[:2]) == "\ufffd"  # a truncated 4-byte sequence
  assert tok.decode([tok.vocab[bytes_to_unicode()[0xFF]], tok.vocab["a"]]) == "\ufffda"
  with pytest.raises(TokenizerError, match="outside the vocabulary"): tok.decode([10**6])

def test_stream_decoder_holds_partial_characters(byte_tokenizer):
  tok = byte_tokenizer
  ids = tok.encode("a🙂b")
  dec = tok.stream_decoder()
  pieces = [dec.push(i) for i in ids]
  assert "".join(pieces) + dec.flush() == "a🙂b"
  assert pieces[0] == "a" and pieces[1:4] == ["", "", ""] and pieces[4] == "🙂"

def test_unsupported_vocabularies():
  with pytest.raises(TokenizerError, match="only byte-level BPE"):
    BPETokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})
  for pre in ("mystery", "deepseek-llm", "chatglm-bpe"):  # still unsupported: refused by name, never mis-split
    with pytest.raises(TokenizerError, match=f"pre-tokenizer.*{pre!r} is not supported.*'llama-bpe'.*'qwen2'"):
      BPETokenizer(["a"], [], pre=pre)

SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
                    "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

def test_render_chat_templates():
  msgs = [{"role": "user", "content": "Hi"}]
  expected = "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
  assert render_chat(SMOLLM2_TEMPLATE, msgs) == expected
  with_system = [{"role": "system", "content": "S"}] + msgs
  assert render_chat(SMOLLM2_TEMPLATE, with_system, add_generation_prompt=False) == \
    "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
  # not ChatML: the template decides the format, with the file's BOS
  assert render_chat(LLAMA3_TEMPLATE, [{"role": "user", "content": " Hi "}], bos_token="<|begin_of_text|>") == \
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" \
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
  assert render_chat(None, msgs) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"  # no template: ChatML

def test_render_chat_errors():
  with pytest.raises(TokenizerError, match="refused the conversation: no system"):
    render_chat("{{ raise_exception('no system') }}", [{"role": "user", "content": "x"}])
  with pytest.raises(TokenizerError, match="not valid Jinja"): render_chat("{% for %}", [])
  with pytest.raises(TokenizerError, match="needs 'role' and 'content'"): render_chat(None, [{"role": "user"}])
  with pytest.raises(TokenizerError, match="failed to render"):  # the sandbox refuses attribute tricks
    render_chat("{{ messages.__class__.__mro__ }}", [])

# ** the real SmolLM2 vocabulary (needs only the GGUF file, not the model weights) **

@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_smollm2_vocab(smollm2_file, text):
  tok = BPETokenizer.from_gguf_metadata(smollm2_file.metadata)
  assert tok.decode(tok.encode(text)) == text

def test_smollm2_prompt_ids(smollm2_file, golden):
  tok = BPETokenizer.from_gguf_metadata(smollm2_file.metadata)
  assert tok.encode(golden["prompt"]) == golden["prompt_ids"]
  assert tok.decode(golden["greedy_20_ids"]) == golden["greedy_20_text"]
