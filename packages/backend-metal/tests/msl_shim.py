"""Run MetalRenderer's MSL on the host: g++ compiles the kernel source against `shim/metal_stdlib`, a generated
launcher loops over the grid (threadgroups, then the threads of each), and ctypes calls it.

Threads run one after another, which is exact for kernels without threadgroup memory, barriers or SIMD shuffles. A
kernel with any of those (group reductions) runs each thread of a threadgroup on its own host thread: `threadgroup`
arrays are function statics, `threadgroup_barrier` is a C++20 barrier over the threadgroup's threads, and
`simd_shuffle_xor` exchanges through a slot per thread: core's host shim workgroup emulation
(`ember.device.hostshim.SHIM_SYNC`), so threadgroup arrays are checked the same way (a race, a read of an element the
threadgroup never wrote or an index out of bounds raises `SharedMemoryError`). Every thread walks the threadgroups in
the same order with a barrier after each.
Many kernels go into one translation unit, each in its own namespace, so a whole corpus costs one g++ run.
"""
from __future__ import annotations
import ctypes
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
import numpy as np
from ember.device.hostshim import SHIM_SYNC, check_shared, raise_shared_memory_error
from ember.plugin import Ops, ProgramSpec, PtrDType
from ember_metal.renderer import MetalRenderer

SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
# exact IEEE arithmetic (no contraction into fma, no fast math), signed char like MSL's char, wrapping ints
CXX_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-fsigned-char", "-fwrapv", "-ffp-contract=off",
             "-fno-fast-math", "-Wno-attributes", "-Werror=return-type")

SYNC_MARKERS = ("threadgroup ", "threadgroup_barrier", "simd_shuffle")

def find_cxx() -> str | None: return shutil.which("g++") or shutil.which("clang++")

def _launcher(spec: ProgramSpec, renderer: MetalRenderer, index: int) -> str:
  """`ember_launch_<index>(bufs, vals, grid xyz, threadgroup xyz)`: the host's dispatchThreadgroups."""
  params = sorted((u for u in spec.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
  args = [f"({renderer.render_dtype(p.dtype)})bufs[{p.arg}]" for p in params]
  lines = []
  for k, var in enumerate(spec.vars):
    lines.append(f"  {renderer.render_dtype(var.dtype)} var{k} = ({renderer.render_dtype(var.dtype)})vals[{k}];")
    args.append(f"var{k}")  # binds to the kernel's `constant T&`
  args += ["uint3{gx, gy, gz}", "uint3{lx, ly, lz}"]
  call = f"k{index}::{spec.name}({', '.join(args)});"
  head = (f'extern "C" void ember_launch_{index}(void** bufs, const long long* vals, uint ngx, uint ngy, uint ngz, '
          f"uint nlx, uint nly, uint nlz) {{\n" + "\n".join(lines) + "\n")
  if any(marker in spec.src for marker in SYNC_MARKERS):  # a host thread per Metal thread, a barrier per threadgroup
    return head + ("  uint n = nlx * nly * nlz;\n  std::barrier<> bar(n);\n  ember_barrier = &bar;\n"
                   "  unsigned long long gen0 = ember_launch_gens((unsigned long long)ngx * ngy * ngz);\n"
                   "  ember_workers workers;\n"
                   "  for (uint t = 0; t < n; t++) workers.emplace_back([&, t]() {\n"
                   "    uint lx = t % nlx, ly = (t / nlx) % nly, lz = t / (nlx * nly);\n    ember_tid = t;\n"
                   "    for (uint gz = 0; gz < ngz; gz++) for (uint gy = 0; gy < ngy; gy++)\n"
                   "    for (uint gx = 0; gx < ngx; gx++) {\n"
                   "      ember_begin_workgroup(gen0 + ((unsigned long long)gz * ngy + gy) * ngx + gx);\n"
                   f"      {call} ember_sync();\n    }}\n"
                   "  });\n  for (auto& w : workers) w.join();\n  ember_barrier = nullptr;\n}\n")
  return (f'extern "C" void ember_launch_{index}(void** bufs, const long long* vals, uint ngx, uint ngy, uint ngz, '
          f"uint nlx, uint nly, uint nlz) {{\n" + "\n".join(lines) + "\n"
          "  for (uint gz = 0; gz < ngz; gz++) for (uint gy = 0; gy < ngy; gy++) for (uint gx = 0; gx < ngx; gx++)\n"
          "    for (uint lz = 0; lz < nlz; lz++) for (uint ly = 0; ly < nly; ly++) for (uint lx = 0; lx < nlx; lx++)\n"
          f"      {call}\n}}\n")

def translation_unit(specs: list[ProgramSpec], renderer: MetalRenderer) -> str:
  parts = [SHIM_SYNC, "#include <metal_stdlib>"]  # core's workgroup emulation first
  for i, spec in enumerate(specs):  # every threadgroup array checked for races, unwritten reads and bounds
    parts.append(f"namespace k{i} {{\n{check_shared(spec.src, 'threadgroup')}}}\n{_launcher(spec, renderer, i)}")
  return "\n".join(parts)

class ShimCompileError(AssertionError):
  """g++ rejected the rendered MSL (with the shim): the renderer printed something the shim or C++ cannot read."""

@dataclass
class ShimLibrary:
  """The compiled corpus: call `run(i, bufs, vals)` to launch kernel i of the list it was built from."""
  lib: ctypes.CDLL
  specs: list[ProgramSpec]
  def run(self, index: int, bufs: list[np.ndarray], vals: tuple[int, ...] = ()) -> None:
    spec = self.specs[index]
    fn = getattr(self.lib, f"ember_launch_{index}")
    fn.restype = None
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)] + [ctypes.c_uint] * 6
    ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[b.ctypes.data for b in bufs])
    cvals = (ctypes.c_longlong * max(len(vals), 1))(*vals)
    grid, local = spec.global_size or [1, 1, 1], spec.local_size or [1, 1, 1]
    fn(ptrs, cvals, *grid, *local)
    take_error = self.lib.ember_take_error
    take_error.argtypes, take_error.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    raise_shared_memory_error(take_error)

def build(specs: list[ProgramSpec], renderer: MetalRenderer, workdir: str) -> ShimLibrary:
  cxx = find_cxx()
  if cxx is None: raise ShimCompileError("no g++ or clang++ on PATH")
  src, out = os.path.join(workdir, "corpus.cpp"), os.path.join(workdir, "corpus.so")
  with open(src, "w") as f: f.write(translation_unit(specs, renderer))
  proc = subprocess.run([cxx, *CXX_FLAGS, "-I", SHIM_DIR, src, "-o", out], capture_output=True, text=True, timeout=300)
  if proc.returncode != 0: raise ShimCompileError(f"{cxx} rejected the rendered MSL:\n{proc.stderr[-6000:]}")
  return ShimLibrary(ctypes.CDLL(out), specs)

def run_one(spec: ProgramSpec, renderer: MetalRenderer, bufs: list[np.ndarray], vals: tuple[int, ...] = ()) -> None:
  """Compile and launch a single kernel (in place on `bufs`)."""
  with tempfile.TemporaryDirectory(prefix="ember_msl_") as tmp:
    build([spec], renderer, tmp).run(0, bufs, vals)

def buffer_dtypes(spec: ProgramSpec) -> dict[int, PtrDType]:
  return {u.arg: u.dtype for u in spec.uops if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType)}
