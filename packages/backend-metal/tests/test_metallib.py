"""Precompiled libraries: `xcrun metal` + `xcrun metallib` driven by MetalCompiler (against a recording stand-in for
the tools), the packed compiler output, and MetalProgram loading a metallib with dispatch_data_create +
`newLibraryWithData:error:` or compiling source, checked call by call against the recording libobjc."""
from __future__ import annotations
import ctypes
import subprocess
from typing import Any
import pytest
from ember.plugin import CompileError, DeviceError
from ember_metal.compiler import MetalCompiler, XcrunToolchain, pack_metallib, unpack_program
from ember_metal.device import MetalDevice, MetalProgram
from ember_metal.objc import MetalContext, ObjC
from ember_metal.renderer import MetalRenderer
from objc_fake import RecordingDispatch, RecordingLibObjC

SRC = "kernel void k(device float* data0 [[buffer(0)]], constant long& a [[buffer(1)]], " \
      "uint3 gid [[threadgroup_position_in_grid]]) {\n  data0[0] = (float)a;\n}\n"
METALLIB = b"MTLB" + bytes(range(60))

class RecordingTools:
  """Stands in for subprocess.run on `xcrun`: records argv and the source file `metal` was given; writes what each
  tool's `-o` names (AIR for `metal`, `library` for `metallib`); fails with `stderr` when told to."""
  def __init__(self, library: bytes = METALLIB, fail: bytes | None = None) -> None:
    self.library, self.fail = library, fail
    self.argvs: list[list[str]] = []
    self.sources: list[str] = []
  def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    assert kwargs == {"capture_output": True, "timeout": 300}
    self.argvs.append(list(argv))
    if self.fail is not None: return subprocess.CompletedProcess(argv, 1, b"", self.fail)
    out = argv[argv.index("-o") + 1]
    if argv[3] == "metal":
      with open(argv[6]) as f: self.sources.append(f.read())
      with open(out, "wb") as f: f.write(b"AIR")
    else:
      with open(argv[4], "rb") as f: assert f.read() == b"AIR"  # metallib links what metal wrote
      with open(out, "wb") as f: f.write(self.library)
    return subprocess.CompletedProcess(argv, 0, b"", b"")

def _toolchain(tools: RecordingTools, xcrun: str | None = "/usr/bin/xcrun") -> XcrunToolchain:
  return XcrunToolchain(run=tools, which=lambda name: xcrun if name == "xcrun" else None)

def test_compiler_builds_a_metallib_with_xcrun_and_packs_the_source() -> None:
  tools = RecordingTools()
  lib = MetalCompiler(lambda: pytest.fail("the toolchain path opens no Metal device"), _toolchain(tools)) \
    .compile(SRC)
  assert unpack_program(lib) == (SRC, METALLIB)
  # a trivial kernel first (is the toolchain really usable?), then this kernel; metal then metallib each time
  assert tools.sources == ["kernel void ember_probe() {\n}\n", SRC]
  for metal, metallib in (tools.argvs[0:2], tools.argvs[2:4]):
    source, air, library = metal[6], metal[8], metallib[6]
    assert metal == ["xcrun", "-sdk", "macosx", "metal", "-c", "-fno-fast-math", source, "-o", air]
    assert metallib == ["xcrun", "-sdk", "macosx", "metallib", air, "-o", library]
    assert (source.endswith(".metal"), air.endswith(".air"), library.endswith(".metallib")) == (True, True, True)

def test_a_failing_metal_compile_is_a_compile_error_with_the_source() -> None:
  toolchain = _toolchain(RecordingTools())
  assert toolchain.available()
  toolchain.run = RecordingTools(fail=b"kernel.metal:2:3: error: use of undeclared identifier 'q'")
  rejected = r"(?s)Metal rejected a kernel \(xcrun -sdk macosx metal exited 1\): .*undeclared identifier 'q'"
  with pytest.raises(CompileError, match=rejected + r".*   2   data0\[0\]"):
    MetalCompiler(lambda: pytest.fail("the toolchain path opens no Metal device"), toolchain).compile(SRC)

def test_without_the_toolchain_the_compiler_checks_and_returns_source() -> None:
  lib = RecordingLibObjC({"new": 0x0B7, "stringWithUTF8String:": 0x57, "newLibraryWithSource:options:error:": 0x11B})
  context = MetalContext(ObjC(lib), 0x500, RecordingDispatch())
  for toolchain in (_toolchain(RecordingTools(), xcrun=None),  # no xcrun at all
                    _toolchain(RecordingTools(fail=b"xcrun: error: unable to find utility \"metal\""))):
    lib.calls.clear()
    assert MetalCompiler(lambda: context, toolchain).compile(SRC) == SRC.encode()
    assert unpack_program(SRC.encode()) == (SRC, None)
    assert lib.calls == [(lib.cls("MTLCompileOptions"), "new", ()), (0x0B7, "setFastMathEnabled:", (False,)),
                         (lib.cls("NSString"), "stringWithUTF8String:", (SRC.encode(),)),
                         (0x500, "newLibraryWithSource:options:error:", (0x57, 0x0B7, "out-pointer")),
                         (0x0B7, "release", ()), (0x11B, "release", ())]

def test_packed_output_is_checked() -> None:
  with pytest.raises(CompileError, match="not a metallib"): pack_metallib(SRC, b"\x7fELF")
  packed = pack_metallib(SRC, METALLIB)
  with pytest.raises(DeviceError, match="truncated"): unpack_program(packed[:40])

def _device(answers: dict[str, Any], dispatch: RecordingDispatch) -> tuple[MetalDevice, RecordingLibObjC]:
  lib = RecordingLibObjC({"new": 0xDE5C, "maxTotalThreadsPerThreadgroup": 1024, **answers})
  return MetalDevice("METAL", MetalRenderer(), None, MetalContext(ObjC(lib), 0x500, dispatch)), lib

def _pipeline_calls(lib: RecordingLibObjC, library: int) -> list[tuple[int, str, tuple[Any, ...]]]:
  function = 0xF00
  return [(lib.cls("NSString"), "stringWithUTF8String:", (b"k",)), (library, "newFunctionWithName:", (0x57,)),
          (lib.cls("MTLComputePipelineDescriptor"), "new", ()),
          (0xDE5C, "setComputeFunction:", (function,)), (0xDE5C, "setSupportIndirectCommandBuffers:", (True,)),
          (0x500, "newComputePipelineStateWithDescriptor:options:reflection:error:", (0xDE5C, 0, None, "out-pointer")),
          (0xDE5C, "release", ()), (function, "release", ()), (library, "release", ()),
          (0x919E, "maxTotalThreadsPerThreadgroup", ())]

def test_program_loads_a_precompiled_metallib_through_dispatch_data() -> None:
  dispatch = RecordingDispatch()
  dev, lib = _device({"newLibraryWithData:error:": 0x11B, "stringWithUTF8String:": 0x57, "newFunctionWithName:": 0xF00,
                      "newComputePipelineStateWithDescriptor:options:reflection:error:": 0x919E}, dispatch)
  lib.calls.clear()
  program = MetalProgram(dev, "k", pack_metallib(SRC, METALLIB))
  assert dispatch.calls == [("dispatch_data_create", METALLIB), ("dispatch_release", 0xDA7A)]
  assert lib.calls == [(0x500, "newLibraryWithData:error:", (0xDA7A, "out-pointer")), *_pipeline_calls(lib, 0x11B)]
  assert program.var_widths == [8]  # read from the packed source: `constant long& a`
  assert program.pipeline == 0x919E and program.max_threads == 1024

def test_program_compiles_plain_source() -> None:
  dispatch = RecordingDispatch()
  dev, lib = _device({"newLibraryWithSource:options:error:": 0x11B, "stringWithUTF8String:": 0x57,
                      "newFunctionWithName:": 0xF00,
                      "newComputePipelineStateWithDescriptor:options:reflection:error:": 0x919E}, dispatch)
  lib.calls.clear()
  program = MetalProgram(dev, "k", SRC.encode())
  assert dispatch.calls == []
  assert lib.calls == [(lib.cls("MTLCompileOptions"), "new", ()), (0xDE5C, "setFastMathEnabled:", (False,)),
                       (lib.cls("NSString"), "stringWithUTF8String:", (SRC.encode(),)),
                       (0x500, "newLibraryWithSource:options:error:", (0x57, 0xDE5C, "out-pointer")),
                       (0xDE5C, "release", ()), *_pipeline_calls(lib, 0x11B)]
  assert program.var_widths == [8]
  del program  # the pipeline is released with the program
  assert lib.calls[-1] == (0x919E, "release", ())

def test_a_metallib_metal_rejects_is_a_compile_error_and_frees_the_data() -> None:
  dispatch = RecordingDispatch()
  dev, lib = _device({"newLibraryWithData:error:": 0}, dispatch)
  with pytest.raises(CompileError, match="could not load a precompiled metallib: no NSError was returned"):
    MetalProgram(dev, "k", pack_metallib(SRC, METALLIB))
  assert dispatch.calls == [("dispatch_data_create", METALLIB), ("dispatch_release", 0xDA7A)]
  with pytest.raises(DeviceError, match="dispatch_data_create failed"):
    MetalProgram(_device({}, RecordingDispatch(handle=None))[0], "k", pack_metallib(SRC, METALLIB))

def test_dispatch_data_is_created_from_the_bytes() -> None:
  """LibDispatch's argument conversion, with a C function of the same prototype standing in for libdispatch."""
  seen: list[bytes] = []
  @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)
  def dispatch_data_create(buffer: int, size: int, queue: int | None, destructor: int | None) -> int:
    seen.append(ctypes.string_at(buffer, size))
    assert queue is None and destructor is None  # DISPATCH_DATA_DESTRUCTOR_DEFAULT: dispatch copies the bytes
    return 0xDA7A
  from ember_metal.objc import LibDispatch
  stand_in = LibDispatch.__new__(LibDispatch)
  stand_in.lib = type("Lib", (), {"dispatch_data_create": dispatch_data_create})()
  assert stand_in.data_create(METALLIB) == 0xDA7A and seen == [METALLIB]
