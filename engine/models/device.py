"""Where an engine runs: its device and dtype, resolved from EngineConfig's "auto"."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> str:
    """'auto' -> cuda if available else cpu; a CUDA device that is not here -> ValueError."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but CUDA is not available")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """EngineConfig.dtype on ``device``: 'auto' is bfloat16 on CUDA, float32 on the CPU."""
    return DTYPES[dtype if dtype != "auto" else
                  ("bfloat16" if device.startswith("cuda") else "float32")]
