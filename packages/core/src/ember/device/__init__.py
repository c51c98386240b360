"""Devices: `Device` (the registry and DEV selection) and the runtime interfaces every backend implements."""
from __future__ import annotations
from ember.device.base import Allocator, Buffer, BufferSpec, Compiled, Compiler, LRUAllocator, MemoryStats, Program
from ember.device.registry import Device, list_backends

__all__ = ["Device", "list_backends", "Allocator", "Buffer", "BufferSpec", "Compiled", "Compiler", "LRUAllocator",
           "MemoryStats", "Program"]
