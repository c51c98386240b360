"""The CPU compilers: the system C compiler to a shared object, and llvmlite's in-process LLVM to an object file.

Both compile for a target CPU: the host by default, or the ARCH field of `DEV` (`DEV=CPU:LLVM:x86-64-v3`,
`DEV=CPU:C:x86-64-v2`), a CPU name gcc's `-march`/`-mcpu` and LLVM both know. A baseline target runs on every CPU that
has its features, so CI can check the code other hosts get (an AVX2-only x86-64, or AVX-512 without FP16).

AMX is never enabled: `-march=native` and the host CPU features would turn it on where the CPU reports it, and AMX
faults in VMs that do not hand the tile state to guests.
"""
from __future__ import annotations
import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from typing import Any
from ember.plugin import Compiler, CompileError

HOST_ARCHS = ("", "native", "host")  # the ARCH values that mean this machine's CPU

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

def is_host_arch(arch: str) -> bool: return arch.lower() in HOST_ARCHS

def c_flags(arch: str = "") -> tuple[str, ...]:
  """Flags that keep C's float values exact (no contraction, no fast-math) and signed overflow wrapping, for the CPU
  `arch` (the host by default). Kernels never read the floating-point exception flags, so `-fno-trapping-math` (what
  lets gcc vectorise truncf and if-convert float selects) changes no result."""
  flags = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
           "-fwrapv", "-lm")
  cpu = "native" if is_host_arch(arch) else arch
  return flags + ((f"-march={cpu}", *_AMX_OFF) if _is_x86() else (f"-mcpu={cpu}",))

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

# what every kernel may need: C11, the flags above, and _Float16 (clang >= 15 and gcc >= 12 on x86) with its
# conversions from double and float, which targets without AVX512-FP16 (or without F16C) call libgcc for
_PROBE_SRC = "_Float16 ember_probe(_Float16 x, double d) { return x * (_Float16)2 + (_Float16)d; }\n"

# gcc only: loop distribution splits a kernel's loops to find memset/memcpy-like parts (those patterns stay on); the
# unrolled register-blocked kernels never gain from it, and it was a quarter of their compile time (a transformer
# block's kernels: 3.5 -> 2.8 s of gcc, run time unchanged)
GCC_FLAGS: tuple[str, ...] = ("-fno-tree-loop-distribution",)
# gcc on Linux links a kernel's shared object without the C runtime's start files and default libraries, only libm and
# libgcc's static helpers (the _Float16 conversions): a kernel needs no constructors, and anything of libc's it calls
# (memset) is found at load time in the process, as libm's is. 22 instead of 28 ms of gcc CPU per process, of which a
# train step's cold first call runs 9
if sys.platform.startswith("linux"): GCC_FLAGS += ("-nostdlib", "-lgcc")

def _is_gcc(version: str) -> bool:
  """Whether `cc --version` printed is gcc's (clang's names clang; `cc` may be either)."""
  first = version.splitlines()[0].lower() if version else ""
  return "clang" not in first and ("gcc" in first or "free software foundation" in version.lower())

@functools.cache
def _cannot_build_kernels(cc: str, arch: str = "") -> str | None:
  """None if `cc` compiles what ClangRenderer emits with our flags for `arch`, else the compiler's complaint."""
  with tempfile.TemporaryDirectory(prefix="ember_cc_") as tmp:
    try:
      cmd = [cc, "-x", "c", "-", "-o", os.path.join(tmp, "probe.so"), *c_flags(arch)]
      proc = subprocess.run(cmd, input=_PROBE_SRC.encode(), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
      return str(e)
  return None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()

class ClangCompiler(Compiler):
  """Compiles C with the system compiler into a shared object for the CPU `arch` (the host by default), returned as
  bytes: $EMBER_CC if set, else gcc, else clang, else cc, skipping one that cannot build the kernels (an old clang or
  gcc without _Float16, or one that does not know `arch`)."""
  binary_format = "elf-so"
  parallel_compile = True  # each compile is its own compiler process in its own temporary directory
  batch_compile = True  # kernels are plain C functions: one translation unit holds several
  # and kernels of one name too, each its own binary out of one compile (`compile_batch`)
  batch_repeated_names = True
  def __init__(self, cc: str | None = None, arch: str = "") -> None:
    if cc is None and (chosen := os.environ.get("EMBER_CC")):
      if (cc := shutil.which(chosen)) is None:
        raise CompileError(f"EMBER_CC={chosen!r} is not a compiler on PATH; set it to one (gcc, clang, a full path) "
                           "or unset it")
    candidates = [cc] if cc is not None else [p for name in C_COMPILERS if (p := shutil.which(name)) is not None]
    if not candidates:
      raise CompileError("no C compiler found for DEV=CPU:C (looked for gcc, clang and cc on PATH); "
                         "install one (e.g. `apt-get install gcc` or `clang`), or use DEV=CPU:LLVM")
    problems = {c: _cannot_build_kernels(c, arch) for c in candidates}
    found = next((c for c, problem in problems.items() if problem is None), None)
    if found is None:
      details = "; ".join(f"{c}: {problem}" for c, problem in problems.items())
      target = "" if is_host_arch(arch) else f" for CPU {arch!r} (DEV=CPU:C:{arch}; drop the ARCH for the host)"
      raise CompileError(f"no C compiler on PATH can build CPU kernels{target} ({details}); install clang >= 15 or "
                         "gcc >= 12, or use DEV=CPU:LLVM")
    version = _compiler_version(found)
    self.cc, self.arch, self.flags = found, arch, c_flags(arch) + (GCC_FLAGS if _is_gcc(version) else ())
    key = _digest(version, *self.flags, _host_cpu_id() if is_host_arch(arch) else "")
    super().__init__(f"compile_c_{os.path.basename(found)}_{key}")
  def _run(self, args: list[str], src: str, out: str) -> bytes:
    """`cc` on `src` (read from stdin) with `args`, returning the file `out` it writes."""
    try: proc = subprocess.run([self.cc, *args], input=src.encode(), capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.cc} failed: {e}") from e
    if proc.returncode != 0:
      errors = proc.stderr.decode(errors="replace")
      raise CompileError(f"{self.cc} rejected a kernel:\n{errors}\nsource:\n{_numbered(src)}")
    with open(out, "rb") as f: return f.read()
  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember_cc_") as tmp:
      out = os.path.join(tmp, "kernel.so")
      return self._run(["-x", "c", "-", "-o", out, *self.flags], src, out)
  def compile_together(self, srcs: list[str]) -> bytes:
    """One shared object of every kernel in `srcs` (their names distinct): their sources in one translation unit."""
    return self.compile(_one_unit(srcs))
  def compile_batch(self, srcs: list[str]) -> list[bytes]:
    """A shared object for each kernel of `srcs` out of one compile of them all, names repeating or not (a train
    step's small kernels: four r_256_10, two E_512). A repeated name's kernels are renamed apart in the translation
    unit (`<name>__<i>`); the shared object built gives the name to the first of them (`--defsym`), and a copy of it
    with the name's dynamic symbol pointed at the i-th (`_elf_rebind`) is the i-th's. One compiler process for the
    batch instead of one per kernel: gcc's start and link cost ~23 ms a process, a small kernel's own code a few ms.
    Where shared objects are not ELF (macOS), the kernels of each name compile in separate batches."""
    names = [_kernel_symbol(src) for src in srcs]
    count: dict[str, int] = {}
    nth: list[int] = []  # which of its name's kernels each one is
    for name in names:
      nth.append(count.get(name, 0))
      count[name] = nth[-1] + 1
    copies = max(count.values())
    if copies == 1: return [self.compile_together(srcs)] * len(srcs)
    if sys.platform == "darwin":
      groups = [[src for src, i in zip(srcs, nth) if i == j] for j in range(copies)]
      libs = [self.compile_together(g) if len(g) > 1 else self.compile(g[0]) for g in groups]
      return [libs[i] for i in nth]
    def symbols(name: str) -> tuple[str, str]: return name, name + _ARGFMT
    def renames(i: int) -> dict[str, str]:
      return {s: f"{s}__{i}" for name, n in count.items() if n > max(i, 1) for s in symbols(name)}
    parts = []
    for src, name, i in zip(srcs, names, nth):
      if count[name] == 1: parts.append(src)
      else: parts.append("".join(f"#define {s} {s}__{i}\n" for s in symbols(name)) + src +
                         "".join(f"#undef {s}\n" for s in symbols(name)))
    with tempfile.TemporaryDirectory(prefix="ember_cc_") as tmp:
      out = os.path.join(tmp, "kernels.so")
      defsyms = [f"-Wl,--defsym={a}={b}" for a, b in renames(0).items()]
      first = self._run(["-x", "c", "-", "-o", out, *self.flags, *defsyms], _one_unit(parts), out)
    libs = [first] + [_elf_rebind(first, renames(i)) for i in range(1, copies)]
    return [libs[i] for i in nth]

_ARGFMT = "_argfmt"  # ember_cpu.renderer.ARGFMT_SUFFIX: the C renderer defines `const char <kernel>_argfmt[]`
_SYMBOL = re.compile(r"^const char (\w+)" + _ARGFMT + r"\[\]", re.M)

def _kernel_symbol(src: str) -> str:
  """The kernel a C renderer's source defines: the name of its argument format string."""
  if (m := _SYMBOL.search(src)) is None: raise CompileError(f"no kernel (`const char <name>{_ARGFMT}[]`) in:\n{src}")
  return m.group(1)

def _elf_rebind(lib: bytes, renames: dict[str, str]) -> bytes:
  """A copy of the ELF shared object `lib` (64-bit, little-endian) whose dynamic symbols `renames` names point where
  the symbols they map to do (value and size): `dlsym` then finds the target under the name. Nothing in a kernel's
  shared object refers to its own kernels, so no relocation needs to follow."""
  if lib[:6] != b"\x7fELF\x02\x01": raise CompileError("not a 64-bit little-endian ELF shared object")
  out = bytearray(lib)
  shoff, = struct.unpack_from("<Q", lib, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", lib, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", lib, shoff + i * shentsize) for i in range(shnum)]
  for _, kind, _, _, offset, size, link, _, _, entsize in sections:
    if kind != 11: continue  # SHT_DYNSYM
    strtab = sections[link][4]
    at: dict[str, int] = {}
    for pos in range(offset + entsize, offset + size, entsize):
      name, = struct.unpack_from("<I", lib, pos)
      at[lib[strtab + name:lib.index(b"\0", strtab + name)].decode()] = pos
    for name, target in renames.items():
      if name not in at or target not in at: raise CompileError(f"shared object has no dynamic symbol {name}/{target}")
      out[at[name] + 8:at[name] + 24] = lib[at[target] + 8:at[target] + 24]  # st_value, st_size
  return bytes(out)

def _one_unit(srcs: list[str]) -> str:
  """Kernel sources as one translation unit, each `static` helper line (a bit cast the renderer defines per kernel)
  written once."""
  seen: set[str] = set()
  lines = []
  for src in srcs:
    for line in src.splitlines():
      if line.startswith("static "):
        if line in seen: continue
        seen.add(line)
      lines.append(line)
  return "\n".join(lines) + "\n"

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

def llvm_cpu(arch: str = "") -> tuple[str, str]:
  """(CPU name, feature string) of LLVM's target for `arch`: the host's own, or the named CPU with AMX off."""
  if is_host_arch(arch): return _llvm().get_host_cpu_name(), host_cpu_features()
  _check_llvm_cpu(arch)
  return arch, ("-amx-tile,-amx-int8,-amx-bf16" if _is_x86() else "")

# LLVM only warns on stderr about a CPU name it does not know and then compiles for a generic CPU; a child process
# shows whether it does
_CPU_PROBE = """import llvmlite.binding as llvm
llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
target = llvm.Target.from_triple(llvm.get_process_triple())
target.create_target_machine(cpu={cpu!r}, opt=2).emit_assembly(llvm.parse_assembly("define void @f() {{ ret void }}"))
"""

@functools.cache
def _check_llvm_cpu(arch: str) -> None:
  try: proc = subprocess.run([sys.executable, "-c", _CPU_PROBE.format(cpu=arch)], capture_output=True, timeout=120)
  except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"cannot check LLVM CPU {arch!r}: {e}") from e
  complaint = proc.stderr.decode(errors="replace").strip()
  if proc.returncode != 0 or "not a recognized processor" in complaint:
    raise CompileError(f"LLVM does not know the CPU {arch!r} ({complaint}); name one it does (x86-64-v2, x86-64-v3, "
                       "znver4, neoverse-n1, ...) in DEV=CPU:LLVM:<cpu>, or drop the ARCH for the host")

def new_target_machine(arch: str = "") -> Any:
  """A fresh llvmlite target machine for the CPU `arch` (an MCJIT engine takes ownership of the one it is given, so
  every engine needs its own)."""
  llvm = _llvm()
  cpu, features = llvm_cpu(arch)
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=cpu, features=features, opt=2, jit=True)

@functools.cache
def target_machine(arch: str = "") -> Any:
  """The shared target machine that compiles and describes (triple, datalayout) kernels; never given to an engine."""
  return new_target_machine(arch)

# ** symbols a JIT'd kernel may call **
# LLVM lowers some operations to calls into compiler-rt/libgcc: half conversions where the CPU has no instruction for
# them (double -> half without AVX512-FP16, any half conversion without F16C). The in-process JIT resolves a call
# through this process's symbols, where those helpers usually are not, and an unresolved call jumps to address 0. So
# every kernel's object code is checked here, and the helpers come from `ember_cpu.device.install_jit_runtime`.

def undefined_symbols(obj: bytes) -> list[str]:
  """The names an ELF or Mach-O object file (64-bit, little-endian) uses without defining them."""
  if obj[:4] == b"\x7fELF": return _elf_undefined(obj)
  if obj[:4] == b"\xcf\xfa\xed\xfe": return _macho_undefined(obj)
  raise CompileError(f"unknown object file format (magic {obj[:4].hex()}); the CPU JIT handles ELF and Mach-O")

def _elf_undefined(obj: bytes) -> list[str]:
  shoff, = struct.unpack_from("<Q", obj, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
  names: list[str] = []
  for _, kind, _, _, offset, size, link, _, _, entsize in sections:
    if kind != 2: continue  # SHT_SYMTAB
    strtab = sections[link][4]
    for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
      name, info, _, shndx = struct.unpack_from("<IBBH", obj, at)
      if shndx == 0 and info >> 4 != 2 and name:  # undefined, and not weak
        names.append(obj[strtab + name:obj.index(b"\0", strtab + name)].decode())
  return names

def _macho_undefined(obj: bytes) -> list[str]:
  ncmds, = struct.unpack_from("<I", obj, 16)
  at, names = 32, []
  for _ in range(ncmds):
    cmd, size = struct.unpack_from("<II", obj, at)
    if cmd == 2:  # LC_SYMTAB
      symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", obj, at + 8)
      for i in range(nsyms):
        strx, kind, _, _, _ = struct.unpack_from("<IBBHQ", obj, symoff + 16 * i)
        if kind & 0x0E == 0 and kind & 0x01:  # N_UNDF and N_EXT
          names.append(obj[stroff + strx:obj.index(b"\0", stroff + strx)].decode().removeprefix("_"))
    at += size
  return names

def unresolved_symbols(obj: bytes) -> list[str]:
  """The symbols of a kernel's object code the in-process JIT cannot resolve: neither ember's JIT runtime nor this
  process defines them."""
  from ember.plugin import JIT_RUNTIME_SYMBOLS
  process = ctypes.CDLL(None)
  return sorted({s for s in undefined_symbols(obj) if s not in JIT_RUNTIME_SYMBOLS and not hasattr(process, s)})

class LLVMCompiler(Compiler):
  """Parses, verifies and optimises LLVM IR at O2 for the CPU `arch` (the host by default) in process, then
  generates its object code, which the JIT loads; a kernel that would call a function nobody defines is a
  CompileError, not a jump to address 0."""
  binary_format = "llvm-obj"
  def __init__(self, arch: str = "") -> None:
    llvm, machine = _llvm(), target_machine(arch)
    self.arch = arch
    key = _digest(machine.triple, *llvm_cpu(arch), str(llvm.llvm_version_info))
    super().__init__(f"compile_llvm_{key}")
  def compile(self, src: str) -> bytes:
    llvm, machine = _llvm(), target_machine(self.arch)
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
    obj = machine.emit_object(mod)
    if missing := unresolved_symbols(obj):
      cpu = llvm_cpu(self.arch)[0]
      raise CompileError(f"LLVM compiled a kernel for CPU {cpu} into calls of {', '.join(missing)}, which neither "
                         "ember's JIT runtime nor this process defines; the kernel would jump to address 0. Add "
                         f"them to ember.plugin.jit_runtime_ir, or use DEV=CPU:C\nsource:\n{_numbered(src)}")
    return obj
