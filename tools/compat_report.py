"""List tinygrad's public Tensor names that ember.Tensor lacks, with the reason each one is left out.

    python tools/compat_report.py             # report (tinygrad's names from tinygrad if importable, else the list)
    python tools/compat_report.py --save      # regenerate tools/tinygrad_tensor_names.txt from the installed tinygrad
    python tools/compat_report.py --markdown  # the table docs/tinygrad-compat.md holds

tinygrad is only read here (for its list of names), never imported by ember itself.
"""
from __future__ import annotations
import argparse
import importlib
import pathlib
import sys

NAMES_FILE = pathlib.Path(__file__).with_name("tinygrad_tensor_names.txt")

# why each name tinygrad has is not on ember.Tensor
REASONS = {
  "alu": "internal: applies a raw UOp op; ember's elementwise methods build the UOps",
  "as_param": "belongs to the custom-kernel issue (parameters of a user kernel)",
  "call": "internal to tinygrad's graph-level functions (CALL UOps); ember.function traces the body instead",
  "callify": "internal to tinygrad's graph-level functions (CALL UOps)",
  "const": "internal constructor of a const UOp; use Tensor(value) or Tensor.full",
  "const_like": "internal; use full_like",
  "custom_kernel": "belongs to the custom-kernel issue",
  "decode_hevc_frame": "hardware video decode: no ember device has a decoder",
  "from_url": "downloads; ember does no network access (fetch the file, then Tensor(bytes) or nn.state loaders)",
  "image_conv2d": "tinygrad's IMAGE (texture) dtype path for Qualcomm GPUs: no such ember device",
  "image_dot": "tinygrad's IMAGE (texture) dtype path for Qualcomm GPUs: no such ember device",
  "invalids": "internal write-only scratch of tinygrad's function capture",
  "is_param": "belongs to the custom-kernel issue (parameter marking)",
  "is_param_": "belongs to the custom-kernel issue (parameter marking)",
  "linear_with_vars": "internal: lowers a schedule with symbolic values",
  "max_numel": "symbolic-shape helper internal to tinygrad's scheduler",
  "max_shape": "symbolic-shape helper internal to tinygrad's scheduler",
  "schedule_linear": "internal: tinygrad's linearized schedule; ember has Tensor.schedule",
  "threefry": "ember's RNG is Threefry-2x32 too; the stateless draw is Tensor.random_bits",
  "ufix": "internal: turns a Python const into a UOp of self's dtype",
  "uprod": "internal symbolic product",
  "usum": "internal symbolic sum",
}

def tinygrad_names() -> tuple[list[str], str]:
  """tinygrad's public Tensor names and where they came from."""
  try: tinygrad = importlib.import_module("tinygrad")
  except ImportError:
    return NAMES_FILE.read_text().split(), f"{NAMES_FILE.name} (tinygrad is not installed)"
  names = sorted(n for n in dir(tinygrad.Tensor) if not n.startswith("_"))
  return names, f"tinygrad {getattr(tinygrad, '__version__', '') or 'installed'}"

def missing(names: list[str]) -> list[str]:
  from ember import Tensor
  return [n for n in names if not hasattr(Tensor, n)]

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--save", action="store_true", help="write tinygrad's names to " + NAMES_FILE.name)
  ap.add_argument("--markdown", action="store_true", help="print the table for docs/tinygrad-compat.md")
  args = ap.parse_args(argv)
  names, source = tinygrad_names()
  if args.save:
    NAMES_FILE.write_text("\n".join(names) + "\n")
    print(f"wrote {len(names)} names to {NAMES_FILE}")
  lacking = missing(names)
  if args.markdown:
    print("| name | why ember leaves it out |\n|---|---|")
    for n in lacking: print(f"| `{n}` | {REASONS.get(n, 'not yet implemented')} |")
    return 0
  print(f"{len(names)} public tinygrad Tensor names ({source}); ember lacks {len(lacking)}:")
  for n in lacking: print(f"  {n:20s} {REASONS.get(n, 'not yet implemented')}")
  return 0

if __name__ == "__main__":
  sys.exit(main())
