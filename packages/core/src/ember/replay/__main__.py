"""The process replay CLI (docs/replay.md).

  python -m ember.replay capture DIR [--only PATTERN ...] [--tree PATH]   # record the corpus's generated code
  python -m ember.replay compare DIR_A DIR_B [--max-diffs N]             # exit 1 when anything differs
  python -m ember.replay list                                            # the corpus's workloads
"""
from __future__ import annotations
import argparse
import os
import sys
import time
from .record import capture, capture_tree
from .report import compare
from .corpus import WORKLOADS
from .errors import ReplayError

def _capture(args: argparse.Namespace) -> int:
  if args.tree: return capture_tree(args.tree, args.dir, args.only)
  if args.expect_ember: _check_ember(args.expect_ember)
  st = time.perf_counter()
  manifest = capture(args.dir, args.only)
  failed = {name: w["error"] for name, w in manifest["workloads"].items() if w["error"] is not None}
  for name, error in failed.items(): sys.stderr.write(f"workload {name} raised {error}\n")
  absent = "; ".join(f"{label} ({why})" for label, why in manifest["unavailable"].items())
  print(f"captured {len(manifest['kernels'])} kernels of {len(manifest['workloads'])} workloads "
        f"({len(failed)} raised) for {len(manifest['renderers'])} renderers ({', '.join(manifest['renderers'])}) "
        f"into {args.dir} in {time.perf_counter() - st:.1f} s" + (f"; not rendered: {absent}" if absent else ""))
  return 0

def _check_ember(core_src: str) -> None:
  """In a `--tree` child: the ember imported must be that tree's, not an installed one that shadows it."""
  import ember
  where = os.path.dirname(os.path.dirname(os.path.abspath(ember.__file__)))
  if os.path.realpath(where) != os.path.realpath(core_src):
    raise ReplayError(f"the capture of {core_src} imported ember from {where}; uninstall that ember or run from a "
                      "virtualenv without it")

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m ember.replay", description=(__doc__ or "").splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  cap = sub.add_parser("capture", help="run the corpus on NULL and store every kernel's code for every renderer")
  cap.add_argument("dir", help="the capture folder (new, empty, or an earlier capture to overwrite)")
  cap.add_argument("--only", action="append", help="workloads to run (fnmatch pattern, repeatable), e.g. 'bench/*'")
  cap.add_argument("--tree", help="capture with the code of this ember checkout instead of the imported one")
  cap.add_argument("--expect-ember", help=argparse.SUPPRESS)  # set by --tree for its child
  cmp = sub.add_parser("compare", help="print what differs between two captures; exit 1 when anything does")
  cmp.add_argument("dir_a")
  cmp.add_argument("dir_b")
  cmp.add_argument("--max-diffs", type=int, default=50, help="unified diffs printed in full (default 50)")
  sub.add_parser("list", help="print the corpus's workloads")
  args = parser.parse_args(argv)
  try:
    if args.command == "capture": return _capture(args)
    if args.command == "compare": return 1 if compare(args.dir_a, args.dir_b, sys.stdout, args.max_diffs) else 0
  except ReplayError as e: parser.error(str(e))  # usage and the message, exit status 2
  print("\n".join(WORKLOADS))
  return 0

if __name__ == "__main__":
  sys.exit(main())
