"""The prepared check for a machine with an NVIDIA GPU: one command runs everything that needs the hardware and writes
a report for packages/backend-nv/README.md.

    python packages/backend-nv/gpu_check.py [--devices CUDA NV] [--matmul 8192] [--out DIR]

Run from a checkout of the repository. It needs no network: ember runs from the source tree (PYTHONPATH and the
EMBER_PLUGINS entry for this backend), so only Python 3.11 with numpy and pytest must be present, plus the NVIDIA
driver (libcuda, /dev/nvidia*) and NVRTC (the CUDA toolkit's libnvrtc, or the nvidia-cuda-nvrtc wheel). Steps, each
in its own process so one failure does not stop the others, each with its output saved under DIR:

1. `python -m ember devices`: which NV interfaces (CUDA, NV) are usable, with reasons;
2. for each device: the conformance kit (`--pyargs ember.testing`) on DEV=<device>;
3. for each device: the core Tensor API tests (packages/core/tests/test_tensor_api_*.py; the torch oracle tests skip
   themselves when torch is absent) on DEV=<device>;
4. for each device: bench/bench_suite.py (the `nox -s bench` workloads, ember against numpy in one run);
5. for each device: an fp16 matmul of --matmul size, float32 accumulation, under TinyJit: the median of 10 timed runs
   after 3 warm-ups, in TFLOP/s, with the result checked against numpy on a 256x256 corner.

The report (DIR/gpu_report.md) lists the GPU model (nvidia-smi when present), the date, every step's exit status and
summary line, and the matmul figures. `--devices MOCK+NV --matmul 256 --only matmul` runs the script's own logic on
a machine without a GPU (the tests of this package do).
"""
from __future__ import annotations
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = ("devices", "kit", "api", "bench", "matmul")

def source_env(device: str) -> dict[str, str]:
  """The environment that runs ember from this checkout on `device`."""
  path = os.pathsep.join(os.path.join(ROOT, "packages", p, "src") for p in ("core", "backend-nv", "backend-cpu"))
  old = os.environ.get("PYTHONPATH")
  return {**os.environ, "PYTHONPATH": path + (os.pathsep + old if old else ""), "DEV": device,
          "EMBER_PLUGINS": "nv=ember_nv.plugin,cpu=ember_cpu.plugin"}

MATMUL = r"""
import json, statistics, sys, time
import numpy as np
from ember import Tensor, TinyJit, dtypes, Device
n = int(sys.argv[1])
rng = np.random.default_rng(0)
a_np = rng.uniform(-1, 1, (n, n)).astype(np.float16)
b_np = rng.uniform(-1, 1, (n, n)).astype(np.float16)
a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
@TinyJit
def mm(x, y): return (x.float() @ y.float()).realize()
for _ in range(3): out = mm(a, b)
Device[Device.DEFAULT].synchronize()
times = []
for _ in range(10):
  t0 = time.perf_counter(); mm(a, b); Device[Device.DEFAULT].synchronize(); times.append(time.perf_counter() - t0)
corner = out.numpy()[:256, :256]
want = a_np[:256].astype(np.float32) @ b_np[:, :256].astype(np.float32)
err = float(np.abs(corner - want).max() / max(np.abs(want).max(), 1e-30))
med = statistics.median(times)
print(json.dumps({"n": n, "median_ms": med * 1e3, "tflops": 2 * n ** 3 / med / 1e12, "max_rel_err": err}))
"""

def run(name: str, cmd: list[str], env: dict[str, str], out_dir: str, timeout: int) -> dict[str, object]:
  """Run one step; its stdout+stderr go to DIR/<name>.log. Returns its status and the last line of output."""
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    rc, text = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc, text = 124, f"timed out after {timeout} s\n{e.stdout or ''}{e.stderr or ''}"
  with open(os.path.join(out_dir, f"{name}.log"), "w") as f: f.write(text)
  lines = [line for line in text.strip().splitlines() if line.strip()]
  return {"step": name, "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "last": lines[-1] if lines else ""}

def gpu_model() -> str:
  if shutil.which("nvidia-smi") is None: return "unknown (no nvidia-smi)"
  proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                        capture_output=True, text=True)
  return proc.stdout.strip() or proc.stderr.strip()

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--devices", nargs="+", default=["CUDA", "NV"])
  ap.add_argument("--matmul", type=int, default=8192, help="fp16 matmul size (default 8192)")
  ap.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
  ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "gpu_check_out")))
  ap.add_argument("--timeout", type=int, default=1800, help="seconds per step")
  args = ap.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  results: list[dict[str, object]] = []
  py = sys.executable
  if "devices" in args.only:
    results.append(run("devices", [py, "-m", "ember", "devices"], source_env(args.devices[0]), args.out, 300))
  for dev in args.devices:
    env, tag = source_env(dev), dev.replace("+", "_").replace(":", "_")
    if "kit" in args.only:
      results.append(run(f"kit_{tag}", [py, "-m", "pytest", "-q", "-p", "ember.testing.plugin", "--pyargs",
                                        "ember.testing", f"--ember-device={dev}"], env, args.out, args.timeout))
    if "api" in args.only:
      tests = sorted(os.path.join("packages", "core", "tests", f) for f in os.listdir(
        os.path.join(ROOT, "packages", "core", "tests")) if f.startswith("test_tensor_api_"))
      results.append(run(f"api_{tag}", [py, "-m", "pytest", "-q", "-p", "no:ember", *tests], env, args.out,
                         args.timeout))
    if "bench" in args.only:
      results.append(run(f"bench_{tag}", [py, os.path.join("bench", "bench_suite.py"), "--json",
                                          os.path.join(args.out, f"bench_{tag}.json")], env, args.out, args.timeout))
    if "matmul" in args.only:
      r = run(f"matmul_{tag}", [py, "-c", MATMUL, str(args.matmul)], env, args.out, args.timeout)
      try: r["matmul"] = json.loads(str(r["last"]))
      except json.JSONDecodeError: r["matmul"] = None
      results.append(r)
  when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  lines = [f"# GPU check, {when}", "", f"GPU: {gpu_model()}", "", "| step | exit | seconds | last line |",
           "| --- | ---: | ---: | --- |"]
  for r in results: lines.append(f"| {r['step']} | {r['rc']} | {r['seconds']} | {str(r['last'])[:160]} |")
  for r in results:
    if (m := r.get("matmul")):
      lines.append(f"\nfp16 matmul {m['n']} on {r['step'][7:]}: {m['median_ms']:.2f} ms, {m['tflops']:.1f} TFLOP/s "
                   f"(max relative error vs numpy on a 256x256 corner {m['max_rel_err']:.1e})")
  with open(os.path.join(args.out, "gpu_report.md"), "w") as f: f.write("\n".join(lines) + "\n")
  with open(os.path.join(args.out, "gpu_report.json"), "w") as f: json.dump(results, f, indent=1)
  print("\n".join(lines))
  return 0 if all(r["rc"] == 0 for r in results) else 1

if __name__ == "__main__": sys.exit(main())
