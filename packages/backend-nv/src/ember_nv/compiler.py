"""The NV compilers: NVRTC (through ctypes) for CUDA C, ptxas for PTX. Both produce a cubin for one `sm_XX`.

NVRTC is looked up in the `nvidia-cuda-nvrtc` wheel (`pip install ember-backend-nv[nvrtc]`), then in the CUDA toolkit
(`CUDA_HOME`, `/usr/local/cuda`), then on the loader path. ptxas is looked up the same way. Neither needs a GPU.
"""
from __future__ import annotations
import ctypes
import functools
import glob
import importlib.util
import hashlib
import os
import shutil
import subprocess
import tempfile
from ember.plugin import CompileError, Compiler
from ember_nv.renderer import DEFAULT_ARCH, parse_arch

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

def _toolkit_dirs() -> list[str]:
  roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
  return [r for r in roots if r and os.path.isdir(r)]

def wheel_files(*parts: str) -> list[str]:
  """Files matching `nvidia/*/<parts>` in the NVIDIA pip wheels (the `nvidia` namespace package), if installed."""
  spec = importlib.util.find_spec("nvidia")
  roots = list(spec.submodule_search_locations or []) if spec is not None else []
  return [p for root in roots for p in glob.glob(os.path.join(root, "*", *parts))]

def cuda_include_dirs() -> list[str]:
  """Directories holding cuda_fp16.h (kernels with half include it): the NVIDIA wheels', then the toolkit's."""
  dirs = [os.path.dirname(p) for p in wheel_files("include", "cuda_fp16.h")]
  toolkit = [os.path.join(root, "include") for root in _toolkit_dirs()]
  return dirs + [d for d in toolkit if os.path.exists(os.path.join(d, "cuda_fp16.h"))]

def nvrtc_candidates() -> list[str]:
  """Where libnvrtc may be, most specific first: the pip wheel, the toolkit, then the plain soname."""
  found = sorted(wheel_files("lib", "libnvrtc.so*"), reverse=True)
  for root in _toolkit_dirs():
    found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")), reverse=True)
  found = [f for f in found if "builtins" not in os.path.basename(f) and "alt" not in os.path.basename(f)]
  return found + ["libnvrtc.so"]

@functools.cache
def load_nvrtc() -> ctypes.CDLL:
  """libnvrtc, or a CompileError that says how to install it."""
  errors = []
  for path in nvrtc_candidates():
    try: lib = ctypes.CDLL(path)
    except OSError as e:
      errors.append(f"{path}: {e}")
      continue
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
      getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
      getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib
  raise CompileError("NVRTC (libnvrtc.so) not found; install it with `pip install ember-backend-nv[nvrtc]` "
                     f"(the nvidia-cuda-nvrtc wheel) or install the CUDA toolkit. Tried: {'; '.join(errors)}")

def nvrtc_version() -> tuple[int, int]:
  lib, major, minor = load_nvrtc(), ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value

def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
  if status != 0: raise CompileError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(status).decode()}")

def _get(lib: ctypes.CDLL, prog: ctypes.c_void_p, size_fn: str, data_fn: str) -> bytes:
  size = ctypes.c_size_t()
  _check(lib, getattr(lib, size_fn)(prog, ctypes.byref(size)), size_fn)
  buf = ctypes.create_string_buffer(size.value)
  _check(lib, getattr(lib, data_fn)(prog, buf), data_fn)
  return buf.raw

def nvrtc_compile(src: str, arch: str, output: str = "cubin", name: str = "kernel.cu") -> bytes:
  """Compile CUDA C with NVRTC for `arch` (`sm_XX`); `output` is "cubin" or "ptx". Errors quote the source lines."""
  lib = load_nvrtc()
  prog = ctypes.c_void_p()
  _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None), "create")
  try:
    target = arch if output == "cubin" else arch.replace("sm_", "compute_")
    opts = [f"--gpu-architecture={target}".encode(), b"-std=c++17", b"--fmad=false"]
    opts += [f"-I{d}".encode() for d in cuda_include_dirs()]
    copts = (ctypes.c_char_p * len(opts))(*opts)
    status = lib.nvrtcCompileProgram(prog, len(opts), copts)
    if status != 0:
      log = _get(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode(errors="replace")
      hint = ""
      if "cuda_fp16.h" in log and not cuda_include_dirs():
        hint = "\nfix: kernels with half include cuda_fp16.h; install the CUDA toolkit headers or set CUDA_HOME\n"
      raise CompileError(f"NVRTC rejected a kernel for {arch}:\n{log}{hint}\nsource:\n{_numbered(src)}")
    if output == "ptx": return _get(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0")
    return _get(lib, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(prog))

class NVRTCCompiler(Compiler):
  """CUDA C -> cubin for one `sm_XX` with NVRTC; `ptx=True` stops at PTX (for the driver to JIT)."""
  def __init__(self, arch: str = DEFAULT_ARCH, ptx: bool = False) -> None:
    parse_arch(arch)
    self.arch, self.output = arch, "ptx" if ptx else "cubin"
    self.binary_format = self.output
    major, minor = nvrtc_version()
    super().__init__(f"compile_nvrtc_{major}_{minor}_{arch}_{self.output}")
  def compile(self, src: str) -> bytes: return nvrtc_compile(src, self.arch, self.output)

def find_ptxas() -> str | None:
  """ptxas from the CUDA toolkit or PATH, or None."""
  for root in _toolkit_dirs():
    if os.path.exists(path := os.path.join(root, "bin", "ptxas")): return path
  return shutil.which("ptxas")

@functools.cache
def _ptxas_version(ptxas: str) -> str:
  out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
  return out.strip().splitlines()[-1]

class PTXCompiler(Compiler):
  """PTX text -> cubin for one `sm_XX` with ptxas."""
  binary_format = "cubin"
  def __init__(self, arch: str = DEFAULT_ARCH) -> None:
    parse_arch(arch)
    if (ptxas := find_ptxas()) is None:
      raise CompileError("ptxas not found (looked in $CUDA_HOME/bin, /usr/local/cuda/bin and PATH); install the CUDA "
                         "toolkit, or use DEV=NV:CUDA (NVRTC)")
    self.arch, self.ptxas = arch, ptxas
    super().__init__(f"compile_ptxas_{arch}_{hashlib.sha256(_ptxas_version(ptxas).encode()).hexdigest()[:12]}")
  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember_ptx_") as tmp:
      out = os.path.join(tmp, "kernel.cubin")
      inp = os.path.join(tmp, "kernel.ptx")
      with open(inp, "w") as f: f.write(src)
      try: proc = subprocess.run([self.ptxas, f"-arch={self.arch}", "-o", out, inp], capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.ptxas} failed: {e}") from e
      if proc.returncode != 0:
        raise CompileError(f"ptxas rejected a kernel for {self.arch}:\n{proc.stderr.decode(errors='replace')}\n"
                           f"source:\n{_numbered(src)}")
      with open(out, "rb") as f: return f.read()
