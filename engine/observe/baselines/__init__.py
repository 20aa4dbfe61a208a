"""Contiguous (Orca-style) KV allocators, simulated on the same request stream as the engine."""
from engine.observe.baselines.address_space import FirstFitSpace
from engine.observe.baselines.contiguous import POLICIES, ContiguousAllocator

__all__ = ["FirstFitSpace", "ContiguousAllocator", "POLICIES"]
