"""Every call the replay driver makes into ember's pipeline, in one place.

The driver runs against the working tree and against older trees (`capture --tree`, `nox -s replay -- REF`), always
from the working tree's copy, so it may use only APIs that exist at b3dcab1. A refactor that moves one of them keeps
this module working for both trees: look for the new home first, fall back to the old one.
"""
from __future__ import annotations
import contextlib
from typing import Any, Iterator

# the settings that change generated code, fixed for every capture: CPU renderers size their thread split from
# NUM_CPU_THREADS (else the machine's core count), BEAM and NOOPT choose kernel opts, CACHELEVEL=0 keeps the capture
# out of the compile cache
THREADS = 8
SETTINGS: dict[str, Any] = {"NUM_CPU_THREADS": THREADS, "BEAM": 0, "NOOPT": 0, "DEBUG": 0, "CACHELEVEL": 0,
                            "TRANSCENDENTAL": 1, "DEFAULT_FLOAT": "float32", "DEFAULT_INT": "int32", "SEED": 0}

def settings() -> contextlib.AbstractContextManager[Any]:
  from ember import Context
  return Context(**SETTINGS)

@contextlib.contextmanager
def default_device(name: str) -> Iterator[None]:
  """Tensors made without a device land on `name` (ember.nn layers and the LLM make their own); restored after."""
  from ember.device.registry import Device
  prev = Device._dev, Device._default
  Device.DEFAULT = name
  try: yield
  finally: Device._dev, Device._default = prev

@contextlib.contextmanager
def recording(kernels: list[tuple[Any, int, str]]) -> Iterator[None]:
  """Append (kernel AST, buffer count, device) for every kernel each realize schedules, as the scheduler made it
  (before a packed matmul is split into its pack and main calls), then go on as usual. Where the schedule has a
  packing stage (`ember.schedule.pack_operands`, after b3dcab1) its input is recorded; before that, the items
  `ember.engine.realize.run_schedule` gets (Tensor.realize imports it at each call, so wrapping the module attribute
  sees every schedule)."""
  from ember import schedule
  from ember.engine import realize as engine
  def kernels_of(items: list[Any]) -> list[tuple[Any, int, str]]:
    return [(it.ast, len(it.bufs), it.device if hasattr(it, "device") else it.meta["device"])
            for it in items if it.kind == "kernel"]
  if hasattr(schedule, "pack_operands"):
    pack_operands = schedule.pack_operands
    def record_stage(items: list[Any]) -> list[Any]:
      kernels.extend(kernels_of(items))
      return pack_operands(items)
    schedule.pack_operands = record_stage
    try: yield
    finally: schedule.pack_operands = pack_operands
    return
  run_schedule = engine.run_schedule
  def record(items: list[Any], var_vals: dict[str, int] | None = None) -> None:
    kernels.extend(kernels_of(items))
    run_schedule(items, var_vals)
  engine.run_schedule = record
  try: yield
  finally: engine.run_schedule = run_schedule

def seed(value: int) -> None:
  """Seed `value` from fresh RNG state: a state buffer an earlier workload (or test) left behind would change how the
  first draws schedule, so every workload's kernels would depend on what ran before it in the process."""
  from ember import Tensor
  from ember import tensor as tensor_module
  states = getattr(tensor_module, "_rng_states", None)  # per-device RNG state buffers (after b3dcab1)
  if isinstance(states, dict): states.clear()
  Tensor.manual_seed(value)

def registry() -> Any:
  """The loaded backend registry: ``.renderers`` maps a device to its `RendererEntry` list, ``.devices`` a device to
  its `DeviceEntry` list, ``.backends`` holds every backend's record (status, reason)."""
  from ember.device.registry import Device
  return Device.registry

def programs(ast: Any, nbufs: int, renderer: Any, device: str) -> list[Any]:
  """The ProgramSpecs the engine would compile for kernel `ast` over `nbufs` buffers on a device with `renderer` and
  a compiler: a matmul the renderer packs is two programs (pack B, then the matmul over the packed copy)."""
  from ember.codegen import get_program
  from ember.codegen.pack import plan_packing
  plan = plan_packing(ast, renderer)
  asts = [ast] if plan is None or plan.scratch_slot != nbufs else [plan.pack, plan.main]
  return [get_program(a, renderer, device) for a in asts]

def kernel_name(ast: Any) -> str:
  from ember.codegen import kernel_name as name
  return name(ast)

def ember_version() -> str:
  import ember
  return str(ember.__version__)

def llm_api() -> tuple[Any, Any, Any, Any, Any]:
  """ember.nn.llm's Llama, LlamaConfig, its weight source record (a GGUF tensor's raw bytes and type), and the GGML
  type enum and block-size function the model itself uses: read from the model module, whichever GGUF module they
  come from in this tree (ember.nn.llm.gguf at b3dcab1, ember.nn.gguf after)."""
  from ember.nn.llm import model
  return model.Llama, model.LlamaConfig, model._Source, model.GGMLType, model.tensor_nbytes
