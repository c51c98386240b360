"""`python -m ember.viz FILE [--port N]`: serve a trace saved with VIZ=FILE."""
from __future__ import annotations
import argparse
from ember.errors import VizError
from ember.viz import load, serve

def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m ember.viz", description="Serve a VIZ trace saved with VIZ=FILE.")
  parser.add_argument("file", help="the trace (JSON) that VIZ=FILE python program.py saved")
  parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: VIZ_PORT, else 8000)")
  args = parser.parse_args(argv)
  try: data = load(args.file)
  except (VizError, OSError) as e: parser.error(str(e))  # usage and the reason, exit status 2, no traceback
  serve(data, args.port)

if __name__ == "__main__":
  main()
