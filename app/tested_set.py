"""The locked, tested sets in deploy/locks/ (made by deploy/lock.sh with uv's pip compile), read
back: the version pinned for each distribution. Standard library only (and app/__init__.py
imports nothing), so it works in an environment whose packages are broken: app/failures.py
and deploy/canary.py read it there."""
from __future__ import annotations

import re
from pathlib import Path

LOCKS = Path(__file__).resolve().parents[1] / "deploy" / "locks"
PAGE_LOCK = LOCKS / "requirements.txt"
DEV_LOCK = LOCKS / "requirements-dev.txt"
VLLM_LOCK = LOCKS / "requirements-vllm.txt"

# "name==version \" (uv puts the hashes on the lines after; comments say which file wanted it)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def normalize(name: str) -> str:
    """PEP 503's normalized name: lowercase, each run of -_. one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock: Path = PAGE_LOCK) -> dict[str, str]:
    """normalized distribution name -> the version the lock pins; {} if the file is absent."""
    try:
        lines = Path(lock).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    return {normalize(m.group(1)): m.group(2) for line in lines if (m := _PIN.match(line.strip()))}


__all__ = ["LOCKS", "PAGE_LOCK", "DEV_LOCK", "VLLM_LOCK", "normalize", "pinned"]
