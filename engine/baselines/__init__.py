"""Contiguous (Orca-style) KV allocators, simulated on the same request stream as the engine."""
from engine.baselines.address_space import FirstFitSpace
from engine.baselines.contiguous import POLICIES, ContiguousAllocator

__all__ = ["FirstFitSpace", "ContiguousAllocator", "POLICIES"]
