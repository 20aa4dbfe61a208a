"""Summarise a bench/gpu_check.sh run: the issue's targets, measured side by side, and plots.

    python bench/gpu_report.py OUT_DIR

Reads OUT_DIR/kernels.json and OUT_DIR/throughput.json, prints each target with the measured
figure and PASS / MISS (a report, not a test: nothing is tuned to it), and writes
OUT_DIR/bandwidth.png (decode GB/s vs context, with the measured read roofline) and
OUT_DIR/throughput.png (engine vs transformers tokens/s) when matplotlib is installed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TARGETS = {   # issue 9, item 6
    "roofline_pct": 85.0,        # decode attention, >= 1 GB of KV, % of the measured read roofline
    "paged_over_ident": 1.05,    # paged <= 1.05x the same kernel on an identity table
    "paged_over_sdpa": 1.0,      # >= 1.0x SDPA on a contiguous cache (time ratio <= 1)
    "engine_over_hf_b8": 1.5,    # engine tokens/s >= 1.5x transformers at batch 8
}


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def kernel_lines(k: dict) -> list[str]:
    big = [r for r in k["decode"] if r["kv_bytes"] >= 1 << 30]
    if not big:
        return ["decode: no point with >= 1 GB of KV was measured"]
    best = max(big, key=lambda r: r["paged_pct_roofline"])
    worst_ident = max(r["paged_over_ident"] for r in big)
    worst_sdpa = max(r["paged_over_sdpa"] for r in big)
    roof = k["roofline"]["read_roofline_GBps"]

    def verdict(ok):
        return "PASS" if ok else "MISS"
    out = [f"read roofline (measured): {roof:.0f} GB/s",
           f"decode >= 1 GB KV, best: batch {best['batch']} ctx {best['context']}: "
           f"{best['paged_GBps']:.0f} GB/s = {best['paged_pct_roofline']:.1f}% of roofline "
           f"(target >= {TARGETS['roofline_pct']}%) {verdict(best['paged_pct_roofline'] >= TARGETS['roofline_pct'])}",
           f"decode >= 1 GB KV, paged / identity table (worst): {worst_ident:.3f} "
           f"(target <= {TARGETS['paged_over_ident']}) {verdict(worst_ident <= TARGETS['paged_over_ident'])}",
           f"decode >= 1 GB KV, paged / SDPA time (worst): {worst_sdpa:.3f}, SDPA backend "
           f"{sorted({r['sdpa_backend'] for r in big})} (target <= {TARGETS['paged_over_sdpa']}) "
           f"{verdict(worst_sdpa <= TARGETS['paged_over_sdpa'])}",
           "decode current / legacy time per point: "
           + ", ".join(f"b{r['batch']}c{r['context']}={r['paged_over_legacy']:.2f}" for r in k["decode"])]
    for r in k.get("prefill", []):
        out.append(f"prefill b{r['batch']} L{r['prompt']}: current {r['current_TFLOPs']:.1f} "
                   f"TFLOP/s, legacy {r['legacy_TFLOPs']:.1f}, SDPA {r['sdpa_TFLOPs']:.1f}")
    return out


def throughput_lines(t: dict) -> list[str]:
    out = []
    for r in t["rows"]:
        mark = ""
        if r["batch"] == 8:
            ok = r["ratio"] >= TARGETS["engine_over_hf_b8"]
            mark = f" (target >= {TARGETS['engine_over_hf_b8']}x) {'PASS' if ok else 'MISS'}"
        out.append(f"{r['model']} batch {r['batch']}: engine {r['engine_tok_s']:.0f} tok/s, "
                   f"transformers {r['transformers_tok_s']:.0f} tok/s, ratio {r['ratio']:.2f}"
                   f"{mark}; step median {r['step_ms_median']:.2f} ms ({r['backend']})")
    return out


def plots(out_dir: Path, k: dict | None, t: dict | None) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["plots skipped: matplotlib is not installed"]
    made = []
    if k:
        batches = sorted({r["batch"] for r in k["decode"]})
        fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), sharey=True)
        axes = [axes] if len(batches) == 1 else list(axes)
        for ax, b in zip(axes, batches):
            rows = sorted((r for r in k["decode"] if r["batch"] == b), key=lambda r: r["context"])
            ctx = [r["context"] for r in rows]
            for key, label in (("paged_GBps", "paged (random table)"), ("ident_GBps", "identity table"),
                               ("legacy_GBps", "legacy kernel"), ("sdpa_GBps", "SDPA contiguous")):
                ax.plot(ctx, [r[key] for r in rows], marker="o", label=label)
            ax.axhline(k["roofline"]["read_roofline_GBps"], color="k", ls="--", lw=1,
                       label="measured read roofline")
            ax.set_xscale("log", base=2)
            ax.set_title(f"batch {b}")
            ax.set_xlabel("context (tokens)")
        axes[0].set_ylabel("GB/s")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Paged decode attention, {k['meta']['device']} "
                     f"(32/8 heads, D=128, bf16, block 16)")
        fig.tight_layout()
        fig.savefig(out_dir / "bandwidth.png", dpi=110)
        made.append("bandwidth.png")
    if t:
        rows = t["rows"]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels = [f"{r['model']}\nb{r['batch']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["engine_tok_s"] for r in rows], 0.4, label="engine")
        ax.bar([i + 0.2 for i in x], [r["transformers_tok_s"] for r in rows], 0.4,
               label="transformers generate")
        ax.set_xticks(list(x), labels)
        ax.set_yscale("log")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"Engine vs transformers, {t['device']}, {t['dtype']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "throughput.png", dpi=110)
        made.append("throughput.png")
    return [f"wrote {', '.join(made)}"] if made else []


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default="bench/results", type=Path,
                    help="the folder bench/gpu_check.sh wrote (default: bench/results)")
    out_dir = ap.parse_args().out_dir
    k, t = _load(out_dir / "kernels.json"), _load(out_dir / "throughput.json")
    lines = []
    lines += kernel_lines(k) if k else ["kernels.json missing (the kernel benchmark did not finish)"]
    lines += throughput_lines(t) if t else ["throughput.json missing (the engine benchmark did not finish)"]
    lines += plots(out_dir, k, t)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
