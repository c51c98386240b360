"""The Metal compiler: MSL to a metallib with Xcode's offline toolchain (`xcrun metal` + `xcrun metallib`) when it is
installed, else MSL checked by the Metal runtime (`newLibraryWithSource:options:error:`); and the two ways a program
gets its MTLLibrary back (`library_from_metallib`, `library_from_source`). Both compile with fast math off.
"""
from __future__ import annotations
import ctypes
import os
import shutil
import subprocess
import tempfile
from typing import Callable
from ember.plugin import CompileError, Compiler, DeviceError
from ember_metal.objc import MetalContext

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

# ** precompiled libraries **

METALLIB_MAGIC = b"MTLB"  # the first bytes of every .metallib file
PACKED_MAGIC = b"ember-metallib\x00\x01"

def pack_metallib(src: str, metallib: bytes) -> bytes:
  """The compiler's output when it built a metallib: magic, the MSL source's length (8 bytes, little-endian), the
  source (the runtime reads the kernel's variable widths and error context from it), then the metallib."""
  if not metallib.startswith(METALLIB_MAGIC):
    raise CompileError(f"xcrun metallib wrote {len(metallib)} bytes that are not a metallib (no {METALLIB_MAGIC!r} "
                       "header); check the Xcode installation (`xcrun -sdk macosx metallib --version`)")
  raw = src.encode()
  return PACKED_MAGIC + len(raw).to_bytes(8, "little") + raw + metallib

def unpack_program(lib: bytes) -> tuple[str, bytes | None]:
  """(MSL source, metallib or None): what `MetalCompiler` returned, either packed or the plain source."""
  if not lib.startswith(PACKED_MAGIC): return lib.decode(), None
  start = len(PACKED_MAGIC) + 8
  end = start + int.from_bytes(lib[len(PACKED_MAGIC):start], "little")
  if end > len(lib) or not lib[end:].startswith(METALLIB_MAGIC):
    raise DeviceError("a packed Metal program is truncated or has no metallib after its source; clear the compile "
                      "cache (CACHELEVEL=0) and compile again")
  return lib[start:end].decode(), lib[end:]

Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]

class XcrunToolchain:
  """Xcode's offline Metal compiler: `xcrun metal` (MSL to AIR) and `xcrun metallib` (AIR to a library). Usable when
  both tools run; Command Line Tools alone do not ship them, and newer Xcodes download them separately."""
  def __init__(self, run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which) -> None:
    self.run, self.which = run, which
    self._available: bool | None = None
  def available(self) -> bool:
    """Whether the tools exist and compile a trivial kernel (checked once)."""
    if self._available is None:
      self._available = False
      if self.which("xcrun") is not None:
        try:
          self.build("kernel void ember_probe() {\n}\n")
          self._available = True
        except (CompileError, OSError, subprocess.SubprocessError):
          self._available = False
    return self._available
  def _tool(self, argv: list[str], src: str) -> None:
    proc = self.run(argv, capture_output=True, timeout=300)
    if proc.returncode != 0:
      message = (proc.stderr or b"").decode(errors="replace").strip()
      raise CompileError(f"Metal rejected a kernel ({' '.join(argv[:4])} exited {proc.returncode}): {message}\n"
                         f"source:\n{_numbered(src)}")
  def build(self, src: str) -> bytes:
    """Compile MSL with fast math off (IEEE NaN/inf, as the renderer's MAX and the reference need) to a metallib."""
    with tempfile.TemporaryDirectory(prefix="ember-metal-") as tmp:
      source, air, library = (os.path.join(tmp, name) for name in ("kernel.metal", "kernel.air", "kernel.metallib"))
      with open(source, "w") as f: f.write(src)
      self._tool(["xcrun", "-sdk", "macosx", "metal", "-c", "-fno-fast-math", source, "-o", air], src)
      self._tool(["xcrun", "-sdk", "macosx", "metallib", air, "-o", library], src)
      with open(library, "rb") as f: return f.read()

# ** libraries in the Metal runtime **

def library_from_source(ctx: MetalContext, src: str) -> int:
  """An MTLLibrary compiled from MSL by the Metal runtime, with fast math off (IEEE NaN/inf, as the renderer's MAX
  and the reference need)."""
  objc, error = ctx.objc, ctypes.c_void_p()
  with objc.autorelease_pool():
    options = objc.send(objc.cls("MTLCompileOptions"), "new")
    objc.send(options, "setFastMathEnabled:", ctypes.c_bool(False), restype=None)
    try:
      library = objc.send(ctx.device, "newLibraryWithSource:options:error:", objc.string(src),
                          ctypes.c_void_p(options), ctypes.pointer(error))
    finally: objc.send(options, "release", restype=None)
    if not library:
      raise CompileError(f"Metal rejected a kernel: {objc.error_text(error)}\nsource:\n{_numbered(src)}")
  return library

def library_from_metallib(ctx: MetalContext, metallib: bytes) -> int:
  """An MTLLibrary from a precompiled metallib (`newLibraryWithData:error:` takes it as dispatch data)."""
  objc, error = ctx.objc, ctypes.c_void_p()
  data = ctx.dispatch.data_create(metallib)
  if not data: raise DeviceError(f"dispatch_data_create failed for a {len(metallib)}-byte metallib")
  try: library = objc.send(ctx.device, "newLibraryWithData:error:", ctypes.c_void_p(data), ctypes.pointer(error))
  finally: ctx.dispatch.release(data)
  if not library:
    with objc.autorelease_pool(): reason = objc.error_text(error)
    raise CompileError(f"Metal could not load a precompiled metallib: {reason}; it may come from a newer Xcode than "
                       "this macOS supports, clear the compile cache or uninstall the Metal toolchain")
  return library

# ** the compiler **

class MetalCompiler(Compiler):
  """MSL to a metallib with Xcode's Metal toolchain when it is installed (packed with its source, see
  `pack_metallib`); otherwise checks the MSL with `newLibraryWithSource:` and returns the source, which the runtime
  compiles again, served from Metal's own shader cache. `context` opens the Metal device for that check (only
  then)."""
  binary_format = "msl-source or packed metallib"
  def __init__(self, context: Callable[[], MetalContext], toolchain: XcrunToolchain | None = None) -> None:
    super().__init__(None)
    self.toolchain = toolchain or XcrunToolchain()
    self.context = context
  def compile(self, src: str) -> bytes:
    if self.toolchain.available(): return pack_metallib(src, self.toolchain.build(src))
    ctx = self.context()
    ctx.objc.send(library_from_source(ctx, src), "release", restype=None)
    return src.encode()
