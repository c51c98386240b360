"""The op table: for each (domain, op name) the implementations by the opset version they start at. A node runs the
implementation with the highest version at or below the opset its model imports for that domain, as the ONNX spec
versions ops (an op's behaviour holds until the next version that changes it).

Implementations take the node's inputs positionally (a Tensor, a list of Tensors for a sequence, None for an omitted
optional input) and its attributes as keyword arguments; an attribute the signature lacks is unsupported. Those
registered with `ctx=True` also get `ctx`, the NodeContext: the node's outputs, the scope of values (what If/Loop/Scan
bodies read from the outer graph), and the model's opsets.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Callable

OpFn = Callable[..., Any]

@dataclass(frozen=True)
class OpImpl:
  fn: OpFn
  since: int
  ctx: bool

# (domain, op_type) -> implementations, in any order; domain "" is the default ONNX domain (ai.onnx)
OPS: dict[tuple[str, str], list[OpImpl]] = {}

def onnx_op(*names: str, since: int = 1, domain: str = "", ctx: bool = False) -> Callable[[OpFn], OpFn]:
  """Register the decorated function as the implementation of `names` in `domain` from opset `since` on."""
  def register(fn: OpFn) -> OpFn:
    for name in names: OPS.setdefault((domain, name), []).append(OpImpl(fn, since, ctx))
    return fn
  return register

def canonical_domain(domain: str) -> str: return "" if domain in ("", "ai.onnx") else domain

def lookup(domain: str, op_type: str, opset: int) -> OpImpl | None:
  """The implementation a node of `op_type` in a model importing `domain` at `opset` runs, or None."""
  impls = [i for i in OPS.get((canonical_domain(domain), op_type), []) if i.since <= opset]
  return max(impls, key=lambda i: i.since) if impls else None

def versions(domain: str, op_type: str) -> list[int]:
  return sorted(i.since for i in OPS.get((canonical_domain(domain), op_type), []))

@dataclass
class NodeContext:
  """What an op that needs more than its inputs sees: its node's identity, its outputs, the values in scope (for the
  bodies of If/Loop/Scan) and how to run a subgraph."""
  name: str
  op_type: str
  outputs: list[str]
  scope: dict[str, Any]
  run_graph: Callable[..., list[Any]]
  device: str
  opsets: dict[str, int] = field(default_factory=dict)
