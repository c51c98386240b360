"""Llama-family language models from GGUF files: the reader, the byte-level BPE tokenizer, the model and generation.

>>> from ember.nn.llm import GGUFFile, BPETokenizer, Llama, generate  # doctest: +SKIP
>>> f = GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
>>> tok, model = BPETokenizer.from_gguf_metadata(f.metadata), Llama.from_gguf(f)  # doctest: +SKIP
>>> tok.decode(generate(model, tok.encode("Once upon a time"), 20, stop_ids=tok.stop_ids))  # doctest: +SKIP
"""
from __future__ import annotations
from ember.nn.gguf import GGUFFile, GGUFError, GGMLType, dequantize
from ember.nn.llm.tokenizer import BPETokenizer, TokenizerError, render_chat
from ember.nn.llm.model import (KVCache, Llama, LlamaConfig, LlamaSession, ModelError,
                                ContextOverflowError)
from ember.nn.llm.generate import SamplingParams, GenerationStats, generate, sample

__all__ = ["GGUFFile", "GGUFError", "GGMLType", "dequantize", "BPETokenizer", "TokenizerError", "render_chat",
           "Llama", "LlamaConfig", "LlamaSession", "KVCache", "ModelError", "ContextOverflowError", "SamplingParams",
           "GenerationStats", "generate", "sample"]
