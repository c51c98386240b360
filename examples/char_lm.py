"""A char-level transformer language model, written the way a tinygrad program is (`tinygrad` -> `ember` in the
imports): token + position embeddings, pre-norm blocks of causal self-attention
(`Tensor.scaled_dot_product_attention(is_causal=True)`) and a GELU MLP, an untied linear head, AdamW
in a `@TinyJit` train step under `Context(TRAINING=1)`, and a seeded sampler at the end.

The corpus is generated here by a small seeded grammar (no download), so every run trains on the same text.

  DEV=CPU python examples/char_lm.py                                          # 300 steps at batch 32
  DEV=CPU STEPS=30 BS=16 CTX=32 DIM=32 LAYERS=1 SAMPLE_LEN=20 python examples/char_lm.py   # CI's short run

Env: STEPS, BS, CTX (context length), DIM, HEADS, LAYERS, LR, CORPUS_LINES, SEED, SAMPLE_LEN, TEMP.
"""
import random
from ember import Tensor, TinyJit, nn
from ember.helpers import getenv, trange, Context

SUBJECTS = ["the old miller", "a young fox", "the grey cat", "my brother", "the quiet king", "a small bird",
            "the baker", "her sister"]
VERBS = ["saw", "found", "kept", "lost", "followed", "painted", "carried", "remembered"]
OBJECTS = ["the river", "a golden key", "the long road", "an empty boat", "the winter sky", "a broken wheel",
           "the garden gate", "a red apple"]
PLACES = ["in the morning", "by the mill", "under the hill", "at night", "near the sea", "after the rain"]

def corpus(lines: int, seed: int) -> str:
  """`lines` sentences drawn from a fixed grammar with a seeded generator: the same text on every run."""
  rng = random.Random(seed)
  def sentence() -> str:
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.5: s += f" {rng.choice(PLACES)}"
    if rng.random() < 0.3: s += f", and {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return s[0].upper() + s[1:] + "."
  return "\n".join(sentence() for _ in range(lines)) + "\n"

class Block:
  def __init__(self, dim: int, heads: int):
    self.heads = heads
    self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

  def attention(self, x: Tensor) -> Tensor:
    B, T, C = x.shape
    q, k, v = [t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
    return self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))

  def __call__(self, x: Tensor) -> Tensor:
    x = x + self.attention(self.ln1(x))
    return x + self.fc2(self.fc1(self.ln2(x)).gelu())

class CharLM:
  def __init__(self, vocab: int, ctx: int, dim: int, heads: int, layers: int):
    self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
    self.blocks = [Block(dim, heads) for _ in range(layers)]
    self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

  def __call__(self, idx: Tensor) -> Tensor:
    x = self.tok(idx) + self.pos.weight[:idx.shape[1]]
    x = self.ln_f(x.sequential(self.blocks))
    return self.head(x)

def main() -> tuple[float, float]:
  """Train, print the loss as it falls and a sample; returns (loss of the first step, loss of the last step)."""
  Tensor.manual_seed(seed := getenv("SEED", 1337))
  text = corpus(getenv("CORPUS_LINES", 400), seed)
  chars = sorted(set(text))
  stoi = {c: i for i, c in enumerate(chars)}
  data = Tensor([stoi[c] for c in text])
  ctx, bs = getenv("CTX", 64), getenv("BS", 32)
  print(f"corpus: {len(text)} chars, vocab {len(chars)}")

  model = CharLM(len(chars), ctx, getenv("DIM", 64), getenv("HEADS", 4), getenv("LAYERS", 2))
  opt = nn.optim.AdamW(nn.state.get_parameters(model), lr=getenv("LR", 3e-3), weight_decay=0.01)

  @TinyJit
  @Context(TRAINING=1)
  def train_step() -> Tensor:
    opt.zero_grad()
    idx = Tensor.randint(bs, 1, high=len(text) - ctx) + Tensor.arange(ctx + 1).reshape(1, -1)
    window = data[idx]
    loss = model(window[:, :-1]).sparse_categorical_crossentropy(window[:, 1:]).backward()
    return loss.realize(*opt.schedule_step())

  losses: list[float] = []
  for i in (t := trange(steps := getenv("STEPS", 300))):
    losses.append(train_step().item())
    t.set_description(f"loss: {losses[-1]:6.3f}")
    if i % 25 == 0 or i == steps - 1: print(f"step {i:4d} loss {losses[-1]:.3f}")

  @TinyJit
  def next_char(window: Tensor) -> Tensor:
    return (model(window)[0, -1] / getenv("TEMP", 0.8)).softmax().multinomial().realize()

  Tensor.manual_seed(seed)  # the sampler is seeded: the same model gives the same text
  out = [stoi["\n"]] * ctx
  for _ in range(getenv("SAMPLE_LEN", 200)): out.append(next_char(Tensor([out[-ctx:]])).item())
  print("sample:\n" + "".join(chars[i] for i in out[ctx:]))
  return losses[0], losses[-1]

if __name__ == "__main__":
  main()
