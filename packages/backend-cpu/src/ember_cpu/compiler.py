"""The CPU compilers: the system C compiler to a shared object, and llvmlite's in-process optimiser for LLVM IR.

AMX is never enabled: `-march=native` and the host CPU features would turn it on where the CPU reports it, and AMX
faults in VMs that do not hand the tile state to guests.
"""
from __future__ import annotations
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from typing import Any
from ember.plugin import Compiler, CompileError

# gcc first: the C renderer's register blocks are written for its SLP vectoriser (matmul 1024 on the 2-core development
# VM: 190 GFLOP/s with gcc 12, 65 with clang 14, same source); EMBER_CC names another (a name on PATH or a path)
C_COMPILERS = ("gcc", "clang", "cc")
_AMX_OFF = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")

def find_c_compiler() -> str | None:
  """The first of gcc, clang, cc on PATH, or None."""
  for name in C_COMPILERS:
    if (path := shutil.which(name)) is not None: return path
  return None

def _is_x86() -> bool: return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")

def c_flags() -> tuple[str, ...]:
  """Flags that keep C's float values exact (no contraction, no fast-math) and signed overflow wrapping. Kernels never
  read the floating-point exception flags, so `-fno-trapping-math` (what lets gcc vectorise truncf and if-convert
  float selects) changes no result."""
  flags = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
           "-fwrapv", "-lm")
  return flags + (("-march=native", *_AMX_OFF) if _is_x86() else ("-mcpu=native",))

@functools.cache
def _host_cpu_id() -> str:
  """What `-march=native` depends on, so a cache shared between machines never hands out foreign code."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
  except OSError:
    return platform.processor()

@functools.cache
def _compiler_version(cc: str) -> str:
  try: return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError) as e:
    raise CompileError(f"C compiler {cc} does not run ({e}); reinstall it, or use DEV=CPU:LLVM") from e

def _digest(*parts: str) -> str: return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

# what every kernel may need: C11, the flags above, and _Float16 (clang >= 15 and gcc >= 12 on x86)
_PROBE_SRC = "_Float16 ember_probe(_Float16 x) { return x * (_Float16)2; }\n"

@functools.cache
def _cannot_build_kernels(cc: str) -> str | None:
  """None if `cc` compiles what ClangRenderer emits with our flags, else the compiler's complaint."""
  with tempfile.TemporaryDirectory(prefix="ember_cc_") as tmp:
    try:
      cmd = [cc, "-x", "c", "-", "-o", os.path.join(tmp, "probe.so"), *c_flags()]
      proc = subprocess.run(cmd, input=_PROBE_SRC.encode(), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
      return str(e)
  return None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()

class ClangCompiler(Compiler):
  """Compiles C with the system compiler into a shared object, returned as bytes: $EMBER_CC if set, else gcc, else
  clang, else cc, skipping one that cannot build the kernels (an old clang or gcc without _Float16)."""
  binary_format = "elf-so"
  parallel_compile = True  # each compile is its own compiler process in its own temporary directory
  def __init__(self, cc: str | None = None) -> None:
    if cc is None and (chosen := os.environ.get("EMBER_CC")):
      if (cc := shutil.which(chosen)) is None:
        raise CompileError(f"EMBER_CC={chosen!r} is not a compiler on PATH; set it to one (gcc, clang, a full path) "
                           "or unset it")
    candidates = [cc] if cc is not None else [p for name in C_COMPILERS if (p := shutil.which(name)) is not None]
    if not candidates:
      raise CompileError("no C compiler found for DEV=CPU:C (looked for gcc, clang and cc on PATH); "
                         "install one (e.g. `apt-get install gcc` or `clang`), or use DEV=CPU:LLVM")
    problems = {c: _cannot_build_kernels(c) for c in candidates}
    found = next((c for c, problem in problems.items() if problem is None), None)
    if found is None:
      details = "; ".join(f"{c}: {problem}" for c, problem in problems.items())
      raise CompileError(f"no C compiler on PATH can build CPU kernels ({details}); install clang >= 15 or gcc >= 12, "
                         "or use DEV=CPU:LLVM")
    self.cc, self.flags = found, c_flags()
    key = _digest(_compiler_version(found), *self.flags, _host_cpu_id())
    super().__init__(f"compile_c_{os.path.basename(found)}_{key}")
  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember_cc_") as tmp:
      out = os.path.join(tmp, "kernel.so")
      try:
        cmd = [self.cc, "-x", "c", "-", "-o", out, *self.flags]
        proc = subprocess.run(cmd, input=src.encode(), capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"running {self.cc} failed: {e}") from e
      if proc.returncode != 0:
        errors = proc.stderr.decode(errors="replace")
        raise CompileError(f"{self.cc} rejected a kernel:\n{errors}\nsource:\n{_numbered(src)}")
      with open(out, "rb") as f: return f.read()

def _llvm() -> Any:
  try: import llvmlite.binding as llvm
  except ImportError as e:
    raise CompileError("DEV=CPU:LLVM needs llvmlite; `pip install llvmlite`, or use DEV=CPU:C") from e
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  return llvm

def host_cpu_features() -> str:
  """The host CPU's LLVM features with every AMX feature switched off."""
  features = [f for f in _llvm().get_host_cpu_features().flatten().split(",") if f]
  return ",".join("-" + f[1:] if f[1:].startswith("amx") else f for f in features)

def new_target_machine() -> Any:
  """A fresh llvmlite target machine for this CPU (an MCJIT engine takes ownership of the one it is given, so every
  engine needs its own)."""
  llvm = _llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=host_cpu_features(), opt=2, jit=True)

@functools.cache
def host_target_machine() -> Any:
  """The shared target machine that compiles and describes (triple, datalayout) kernels; never given to an engine."""
  return new_target_machine()

class LLVMCompiler(Compiler):
  """Parses, verifies and optimises LLVM IR at O2 for the host in process; returns the optimised IR text."""
  binary_format = "llvm-ir"
  def __init__(self) -> None:
    llvm, machine = _llvm(), host_target_machine()
    key = _digest(machine.triple, llvm.get_host_cpu_name(), host_cpu_features(), str(llvm.llvm_version_info))
    super().__init__(f"compile_llvm_{key}")
  def compile(self, src: str) -> bytes:
    llvm, machine = _llvm(), host_target_machine()
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e:
      raise CompileError(f"LLVM rejected a kernel: {e}\nsource:\n{_numbered(src)}") from e
    tuning = llvm.create_pipeline_tuning_options(speed_level=2)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(mod, passes)
    return str(mod).encode()
