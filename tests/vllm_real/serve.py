"""A real ``vllm serve`` started for a test: vLLM's own CLI on the default model, bound to
127.0.0.1 on a free port, its log in a file, ready when ``/health`` answers. Shared by the
KV-event and the scheduler-tap server tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "assets" / "default-model")
START_TIMEOUT_S = 420


class VllmServe:
    """``vllm serve MODEL --host 127.0.0.1 --port P --dtype float32 *args``, from the repository
    root (so ``--scheduler-cls real_vllm…`` imports), in this process's environment plus
    ``env`` (less VLLM_ENABLE_V1_MULTIPROCESSING: the server's own default)."""

    def __init__(self, log: Path, args: list[str], **env: str):
        self.port, self.log = free_port(), log
        full_env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1",
                        PYTHONPATH=os.pathsep.join(filter(None, [
                            str(ROOT), os.environ.get("PYTHONPATH")])), **env)
        full_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", MODEL,
             "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", *args],
            env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)                 # polling the health endpoint until it answers
        raise RuntimeError(f"vllm serve did not start in {START_TIMEOUT_S} s: "
                           f"{self.log.read_text()[-3000:]}")

    def completion(self, prompt: list[int], max_tokens: int, **extra) -> dict:
        """One greedy completion through the OpenAI API, the whole response."""
        body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True, **extra}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_all(servers: dict[str, VllmServe]):
    """Wait for every server (started together, so their start-ups overlap); stop them all
    when the caller's module is done or one fails to start."""
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for s in servers.values():
            s.wait_ready(deadline)
        yield servers
    finally:
        for s in servers.values():
            s.stop()
