"""Small helpers shared by the hosting checks in deploy/checks/: the repository on sys.path,
results under deploy/results/, and readings of a process from /proc (Linux)."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "deploy" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TICKS = 100          # os.sysconf("SC_CLK_TCK") on Linux


def write_results(name: str, payload: dict, table=None) -> None:
    """deploy/results/<name>.json, and the table as .csv when one is given."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    as_json = json.dumps(payload, indent=2, default=float)
    for suffix, write in ((".json", lambda p: p.write_text(as_json)),
                          (".csv", table.to_csv if table is not None else None)):
        if write is not None:
            write(RESULTS / f"{name}{suffix}")
            print(f"wrote deploy/results/{name}{suffix}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS          # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RssPeak(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, rss_mib(pid), threading.Event()

    def run(self):
        while not self.stop.wait(0.25):
            self.peak = max(self.peak, rss_mib(self.pid))


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (all cores), from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICKS                      # minus idle and iowait


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]
