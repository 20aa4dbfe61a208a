"""GPU bandwidth of the Triton paged-KV kernels (decode attention, store_kv, copy_blocks).

Decode sweep: batch x context (32 query / 8 KV heads, head dim 128, bf16, block size 16, at most
``--max-kv-tokens`` tokens of KV per point). For each point, in the same run (shared machines are
noisy, so only side-by-side ratios mean much):

- ``paged``: the Triton split-K kernel reading K/V through a *random* block table;
- ``ident``: the same kernel with an identity (contiguous) block table;
- ``legacy``: the previous kernel (paged_kernels/legacy/: one page-id load per token), random table;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on a contiguous
  ``[B, kv_heads, L, D]`` cache holding the same K/V (the backend that ran is reported).

Achieved bandwidth = (K+V bytes read + Q + O + block table + lengths) / median time
(``triton.testing.do_bench``, which also flushes L2 between runs). ``%roof`` compares it to a
read roofline measured in this run: the best of a large device-to-device copy ((read+write) / t)
and a ``torch.sum`` over a large tensor (read / t). Host launch overhead is part of the time,
as it is for the engine.

Without CUDA (or triton) it prints that it skipped and exits 0. ``--dry-run-cpu`` (with
TRITON_INTERPRET=1) walks every code path on CPU with tiny shapes: the numbers are meaningless,
it only checks the script itself.
Usage: python bench/kernel_bench.py [--quick] [--batches 1,4,16,64,256] [--contexts 512,2048,8192,32768]
Writes JSON to bench/results/kernels-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.core.block_math import cdiv  # noqa: E402

HQ, HKV, D, BLOCK = 32, 8, 128, 16
DTYPE = torch.bfloat16
RESULTS = Path(__file__).resolve().parent / "results"
DEVICE = "cuda"          # "cpu" only for --dry-run-cpu


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def bench_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    if DEVICE != "cuda":                 # dry run: one timed call, the numbers mean nothing
        t0 = time.perf_counter()
        fn()
        return max(1e-6, (time.perf_counter() - t0) * 1e3)
    from triton.testing import do_bench
    v = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return float(v[0] if isinstance(v, (list, tuple)) else v)


# ---- roofline ------------------------------------------------------------------------------

def measure_roofline(gib: float) -> dict:
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    t_copy = bench_ms(lambda: dst.copy_(src))
    t_sum = bench_ms(lambda: src.sum(dtype=torch.float32))
    nbytes = src.numel() * src.element_size()
    src = dst = None          # free before the sweep allocates
    empty_cache()
    copy_bw = 2 * nbytes / (t_copy * 1e-3)
    sum_bw = nbytes / (t_sum * 1e-3)
    return {"bytes": nbytes, "copy_ms": t_copy, "copy_GBps": copy_bw / 1e9, "sum_ms": t_sum,
            "sum_GBps": sum_bw / 1e9, "read_roofline_GBps": max(copy_bw, sum_bw) / 1e9}


# ---- SDPA ----------------------------------------------------------------------------------

def sdpa_call(q4, k4, v4, scale):
    """q4 [B, HQ, 1, D], k4/v4 [B, HKV, L, D]; GQA via enable_gqa when torch has it."""
    import torch.nn.functional as F
    try:
        return F.scaled_dot_product_attention(q4, k4, v4, scale=scale, enable_gqa=True)
    except TypeError:      # torch < 2.5: no enable_gqa -> expand K/V (reads the same bytes)
        g = q4.shape[1] // k4.shape[1]
        return F.scaled_dot_product_attention(q4, k4.repeat_interleave(g, 1),
                                              v4.repeat_interleave(g, 1), scale=scale)


def sdpa_backend_that_ran(fn) -> str:
    """Name the SDPA backend from the aten ops and CUDA kernels one call runs."""
    from torch.profiler import ProfilerActivity, profile
    if DEVICE != "cuda":
        return "cpu"
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages()).lower()
    except Exception as exc:      # a profiler problem must not sink the benchmark
        return f"unknown ({type(exc).__name__})"
    for key, label in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"),
                       ("efficient", "efficient"), ("mem_eff", "efficient")):
        if key in names:
            return label
    return "math" if names.strip() else "unknown"


def forced_sdpa_times(fn) -> dict:
    """Median time of each SDPA backend that accepts the shapes (None where it refuses)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return {}
    if DEVICE != "cuda":
        return {}
    out = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with sdpa_kernel([backend]):
                    fn()
                    sync()
                    out[name.lower()] = bench_ms(fn)
        except RuntimeError:
            out[name.lower()] = None
    return out


# ---- decode sweep --------------------------------------------------------------------------

def decode_point(batch: int, ctx: int, k_cache, v_cache, with_forced: bool) -> dict:
    from paged_kernels import triton_decode
    from paged_kernels.legacy import triton_decode as legacy_decode

    nblk = ctx // BLOCK
    used = batch * nblk
    scale = D ** -0.5
    gen = torch.Generator(device=DEVICE).manual_seed(batch * 100003 + ctx)
    q = torch.randn(batch, HQ, D, device=DEVICE, dtype=DTYPE, generator=gen)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    rand_table = torch.randperm(k_cache.shape[0], device=DEVICE, generator=gen)[:used]
    rand_table = rand_table.to(torch.int32).view(batch, nblk).contiguous()
    ident_table = torch.arange(used, dtype=torch.int32, device=DEVICE).view(batch, nblk)

    def paged():
        return triton_decode.paged_decode_attention(q, k_cache, v_cache, rand_table, lens, scale,
                                                    ctx)

    def ident():
        return triton_decode.paged_decode_attention(q, k_cache, v_cache, ident_table, lens, scale,
                                                    ctx)

    def legacy():
        return legacy_decode.paged_decode_attention(q, k_cache, v_cache, rand_table, lens, scale)

    # contiguous copy of exactly the K/V the random table points at: [B, HKV, L, D]
    k4 = k_cache[rand_table.long()].view(batch, ctx, HKV, D).permute(0, 2, 1, 3).contiguous()
    v4 = v_cache[rand_table.long()].view(batch, ctx, HKV, D).permute(0, 2, 1, 3).contiguous()
    q4 = q.view(batch, HQ, 1, D)

    def sdpa():
        return sdpa_call(q4, k4, v4, scale)

    got = paged()
    want = sdpa().view(batch, HQ, D)
    max_err = (got.float() - want.float()).abs().max().item()
    legacy_err = (legacy().float() - want.float()).abs().max().item()

    t_paged, t_ident, t_sdpa = bench_ms(paged), bench_ms(ident), bench_ms(sdpa)
    t_legacy = bench_ms(legacy)
    backend = sdpa_backend_that_ran(sdpa)
    forced = forced_sdpa_times(sdpa) if with_forced else {}
    k4 = v4 = None

    kv_bytes = 2 * batch * ctx * HKV * D * DTYPE.itemsize
    other = 2 * q.numel() * q.element_size() + rand_table.numel() * 4 + lens.numel() * 4
    total = kv_bytes + other
    block_n, splits, _ = triton_decode.split_plan(batch, HKV, ctx, D, q.device)
    return {
        "batch": batch, "context": ctx, "kv_bytes": kv_bytes, "bytes": total,
        "block_n": block_n, "splits": splits,
        "paged_ms": t_paged, "ident_ms": t_ident, "sdpa_ms": t_sdpa, "legacy_ms": t_legacy,
        "legacy_GBps": total / (t_legacy * 1e-3) / 1e9, "paged_over_legacy": t_paged / t_legacy,
        "max_abs_err_legacy_vs_sdpa": legacy_err,
        "paged_GBps": total / (t_paged * 1e-3) / 1e9,
        "ident_GBps": total / (t_ident * 1e-3) / 1e9,
        "sdpa_GBps": total / (t_sdpa * 1e-3) / 1e9,
        "paged_over_ident": t_paged / t_ident, "paged_over_sdpa": t_paged / t_sdpa,
        "sdpa_backend": backend, "sdpa_forced_ms": forced, "max_abs_err_vs_sdpa": max_err,
    }


# ---- prefill ---------------------------------------------------------------------------------

def prefill_point(batch: int, prompt: int, k_cache, v_cache) -> dict:
    """Causal prefill of ``batch`` prompts of ``prompt`` tokens (K/V already stored, random
    pages): the current kernel (autotuned on a GPU), the legacy one, and SDPA (is_causal) on a
    contiguous copy. TFLOP/s counts the causal half: 2 * 2 * HQ * D * L * (L + 1) / 2 per prompt."""
    from paged_kernels import triton_prefill
    from paged_kernels.legacy import triton_prefill as legacy_prefill

    nblk = cdiv(prompt, BLOCK)
    gen = torch.Generator(device=DEVICE).manual_seed(batch * 7919 + prompt)
    q = torch.randn(batch * prompt, HQ, D, device=DEVICE, dtype=DTYPE, generator=gen)
    table = torch.randperm(k_cache.shape[0], device=DEVICE, generator=gen)[:batch * nblk]
    table = table.to(torch.int32).view(batch, nblk).contiguous()
    starts = [i * prompt for i in range(batch + 1)]
    lens = [prompt] * batch
    scale = D ** -0.5

    def current():
        return triton_prefill.paged_prefill_attention(q, k_cache, v_cache, table, starts, lens, scale)

    def legacy():
        return legacy_prefill.paged_prefill_attention(q, k_cache, v_cache, table, starts, lens, scale)

    k4 = k_cache[table.long()].flatten(1, 2)[:, :prompt].permute(0, 2, 1, 3).contiguous()
    v4 = v_cache[table.long()].flatten(1, 2)[:, :prompt].permute(0, 2, 1, 3).contiguous()
    q4 = q.view(batch, prompt, HQ, D).permute(0, 2, 1, 3)

    def sdpa():
        import torch.nn.functional as F
        g = HQ // HKV
        return F.scaled_dot_product_attention(q4, k4.repeat_interleave(g, 1),
                                              v4.repeat_interleave(g, 1), is_causal=True,
                                              scale=scale)

    want = sdpa().permute(0, 2, 1, 3).reshape(batch * prompt, HQ, D).float()
    err = (current().float() - want).abs().max().item()
    legacy_err = (legacy().float() - want).abs().max().item()
    t_cur, t_leg, t_sdpa = bench_ms(current), bench_ms(legacy), bench_ms(sdpa)
    flops = batch * 2 * 2 * HQ * D * prompt * (prompt + 1) / 2
    return {"batch": batch, "prompt": prompt, "current_ms": t_cur, "legacy_ms": t_leg,
            "sdpa_ms": t_sdpa, "current_TFLOPs": flops / (t_cur * 1e-3) / 1e12,
            "legacy_TFLOPs": flops / (t_leg * 1e-3) / 1e12,
            "sdpa_TFLOPs": flops / (t_sdpa * 1e-3) / 1e12, "current_over_legacy": t_cur / t_leg,
            "current_over_sdpa": t_cur / t_sdpa, "max_abs_err_vs_sdpa": err,
            "max_abs_err_legacy_vs_sdpa": legacy_err}


# ---- store / copy_blocks ---------------------------------------------------------------------

def store_point(tokens: int, k_cache, v_cache) -> dict:
    from paged_kernels import reference, triton_cache_ops

    gen = torch.Generator(device=DEVICE).manual_seed(tokens)
    k = torch.randn(tokens, HKV, D, device=DEVICE, dtype=DTYPE, generator=gen)
    v = torch.randn_like(k)
    slots = torch.randperm(k_cache.shape[0] * BLOCK, device=DEVICE, generator=gen)[:tokens]
    t_tri = bench_ms(lambda: triton_cache_ops.store_kv(k_cache, v_cache, k, v, slots))
    t_ref = bench_ms(lambda: reference.store_kv(k_cache, v_cache, k, v, slots))
    nbytes = 2 * 2 * k.numel() * k.element_size() + slots.numel() * 8   # read + write, K and V
    return {"tokens": tokens, "bytes": nbytes, "triton_ms": t_tri, "torch_ms": t_ref,
            "triton_GBps": nbytes / (t_tri * 1e-3) / 1e9,
            "torch_GBps": nbytes / (t_ref * 1e-3) / 1e9, "triton_over_torch": t_tri / t_ref}


def copy_point(pairs: int, layers: int) -> dict:
    from paged_kernels import reference, triton_cache_ops

    num_blocks = 2 * pairs + 8
    kv = torch.empty(layers, 2, num_blocks, BLOCK, HKV, D, device=DEVICE, dtype=DTYPE).normal_()
    perm = torch.randperm(num_blocks, device=DEVICE)
    src, dst = perm[:pairs].contiguous(), perm[pairs:2 * pairs].contiguous()
    t_tri = bench_ms(lambda: triton_cache_ops.copy_blocks(kv, src, dst))
    t_ref = bench_ms(lambda: reference.copy_blocks(kv, src, dst))
    block_bytes = kv[0, 0, 0].numel() * kv.element_size()
    nbytes = 2 * pairs * layers * 2 * block_bytes          # read + write, every layer, K and V
    kv = None
    empty_cache()
    return {"pairs": pairs, "layers": layers, "bytes": nbytes, "triton_ms": t_tri,
            "torch_ms": t_ref, "triton_GBps": nbytes / (t_tri * 1e-3) / 1e9,
            "torch_GBps": nbytes / (t_ref * 1e-3) / 1e9, "triton_over_torch": t_tri / t_ref}


# ---- main ----------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=ints, default=[1, 4, 16, 64, 256])
    ap.add_argument("--contexts", type=ints, default=[512, 2048, 8192, 32768])
    ap.add_argument("--max-kv-tokens", type=int, default=2 * 1024 * 1024)
    ap.add_argument("--roofline-gib", type=float, default=4.0)
    ap.add_argument("--no-forced-sdpa", action="store_true",
                    help="skip timing each SDPA backend separately")
    ap.add_argument("--quick", action="store_true", help="a few points only (smoke run)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="check the script on CPU (needs TRITON_INTERPRET=1); tiny, meaningless numbers")
    args = ap.parse_args()
    global DEVICE

    from paged_kernels.triton_support import interpreting, triton_importable, triton_version
    if args.dry_run_cpu:
        if not (triton_importable() and interpreting()):
            print("bench/kernel_bench.py: --dry-run-cpu needs triton and TRITON_INTERPRET=1")
            return 1
        DEVICE = "cpu"
        args.batches, args.contexts, args.roofline_gib = [1, 2], [32, 64], 0.01
        args.max_kv_tokens = 128
    else:
        if not torch.cuda.is_available():
            print("bench/kernel_bench.py: skipped (CUDA not available; these are GPU kernels)")
            return 0
        if not triton_importable():
            print("bench/kernel_bench.py: skipped (triton not installed)")
            return 0
        if interpreting():
            print("bench/kernel_bench.py: skipped (TRITON_INTERPRET=1 is set: unset it to time the GPU)")
            return 0
    if args.quick:
        args.batches, args.contexts, args.roofline_gib = [1, 64], [512, 8192], 1.0

    torch.manual_seed(0)
    if DEVICE == "cuda":
        dev = torch.cuda.get_device_properties(0)
        dev_name, sms = dev.name, dev.multi_processor_count
    else:
        dev_name, sms = "cpu (dry run, Triton interpreter)", 0
    meta = {"device": dev_name, "sms": sms, "torch": torch.__version__,
            "triton": triton_version(), "cuda": torch.version.cuda, "python": platform.python_version(),
            "shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "block_size": BLOCK,
                      "dtype": str(DTYPE)}, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"{dev_name} ({sms} SMs)  torch {torch.__version__}  "
          f"triton {triton_version()}")

    with torch.inference_mode():
        roof = measure_roofline(args.roofline_gib)
        print(f"roofline: d2d copy {roof['copy_GBps']:.0f} GB/s, sum {roof['sum_GBps']:.0f} GB/s "
              f"-> read roofline {roof['read_roofline_GBps']:.0f} GB/s")
        roof_bw = roof["read_roofline_GBps"]

        points = [(b, c) for b in args.batches for c in args.contexts
                  if b * c <= args.max_kv_tokens and c % BLOCK == 0]
        max_tokens = max(b * c for b, c in points)
        pool_blocks = max_tokens // BLOCK + 64
        k_cache = torch.empty(pool_blocks, BLOCK, HKV, D, device=DEVICE, dtype=DTYPE).normal_()
        v_cache = torch.empty_like(k_cache).normal_()

        print(f"\ndecode attention ({HQ}/{HKV} heads, D={D}, bf16, block {BLOCK}); GB/s and ratios "
              "of median times (paged/ident, paged/sdpa: < 1 = paged faster)")
        hdr = (f"{'batch':>5} {'ctx':>6} {'split':>5} {'paged us':>9} {'GB/s':>6} {'%roof':>6} "
               f"{'ident GB/s':>10} {'sdpa GB/s':>9} {'p/ident':>7} {'p/sdpa':>7} {'p/legacy':>8} "
               f"{'sdpa':>9} {'err':>8}")
        print(hdr)
        decode = []
        for b, c in points:
            r = decode_point(b, c, k_cache, v_cache, not args.no_forced_sdpa)
            r["paged_pct_roofline"] = 100 * r["paged_GBps"] / roof_bw
            r["ident_pct_roofline"] = 100 * r["ident_GBps"] / roof_bw
            r["sdpa_pct_roofline"] = 100 * r["sdpa_GBps"] / roof_bw
            decode.append(r)
            print(f"{b:>5} {c:>6} {r['splits']:>5} {1e3 * r['paged_ms']:>9.1f} "
                  f"{r['paged_GBps']:>6.0f} {r['paged_pct_roofline']:>5.1f}% "
                  f"{r['ident_GBps']:>10.0f} {r['sdpa_GBps']:>9.0f} {r['paged_over_ident']:>7.2f} "
                  f"{r['paged_over_sdpa']:>7.2f} {r['paged_over_legacy']:>8.2f} "
                  f"{r['sdpa_backend']:>9} {r['max_abs_err_vs_sdpa']:>8.1e}",
                  flush=True)
            for key in ("max_abs_err_vs_sdpa", "max_abs_err_legacy_vs_sdpa"):
                if r[key] > 5e-2:
                    print(f"      WARNING: {key} = {r[key]:.3g}")

        print(f"\nprefill attention (causal, random pages; TFLOP/s of the causal half; ratios of "
              "median times, < 1 = current faster)")
        print(f"{'batch':>5} {'prompt':>6} {'cur ms':>8} {'TFLOP/s':>8} {'legacy':>8} {'sdpa':>8} "
              f"{'c/legacy':>8} {'c/sdpa':>7} {'err':>8}")
        prefill = []
        pf_points = ([(1, 2048), (8, 512)] if args.quick else
                     [(1, 512), (1, 2048), (1, 8192), (8, 512), (8, 2048)]) if DEVICE == "cuda" \
            else [(1, 20), (2, 9)]
        for b, L in pf_points:
            if b * cdiv(L, BLOCK) > k_cache.shape[0]:
                continue
            r = prefill_point(b, L, k_cache, v_cache)
            prefill.append(r)
            print(f"{b:>5} {L:>6} {r['current_ms']:>8.3f} {r['current_TFLOPs']:>8.1f} "
                  f"{r['legacy_TFLOPs']:>8.1f} {r['sdpa_TFLOPs']:>8.1f} "
                  f"{r['current_over_legacy']:>8.2f} {r['current_over_sdpa']:>7.2f} "
                  f"{r['max_abs_err_vs_sdpa']:>8.1e}", flush=True)
            for key in ("max_abs_err_vs_sdpa", "max_abs_err_legacy_vs_sdpa"):
                if r[key] > 5e-2:
                    print(f"      WARNING: {key} = {r[key]:.3g}")

        print("\nstore_kv (K and V, random slots; bytes = read + write)")
        print(f"{'tokens':>7} {'triton us':>10} {'GB/s':>7} {'%roof':>6} {'torch GB/s':>10} "
              f"{'tri/torch':>9}")
        store = []
        for t in ([256, 16384] if args.quick else [1, 64, 256, 4096, 16384, 65536]) if DEVICE == "cuda" else [1, 5]:
            r = store_point(t, k_cache, v_cache)
            r["triton_pct_roofline"] = 100 * r["triton_GBps"] / roof_bw
            store.append(r)
            print(f"{t:>7} {1e3 * r['triton_ms']:>10.1f} {r['triton_GBps']:>7.0f} "
                  f"{r['triton_pct_roofline']:>5.1f}% {r['torch_GBps']:>10.0f} "
                  f"{r['triton_over_torch']:>9.2f}", flush=True)
        del k_cache, v_cache
        empty_cache()

        print("\ncopy_blocks (all layers, K and V, one launch; bytes = read + write)")
        print(f"{'pairs':>6} {'layers':>6} {'triton us':>10} {'GB/s':>7} {'%roof':>6} "
              f"{'torch GB/s':>10} {'tri/torch':>9}")
        copies = []
        layers = 32 if DEVICE == "cuda" else 2
        for pairs in ([16, 256] if args.quick else [1, 16, 256, 1024]) if DEVICE == "cuda" else [1, 3]:
            r = copy_point(pairs, layers)
            r["triton_pct_roofline"] = 100 * r["triton_GBps"] / roof_bw
            copies.append(r)
            print(f"{pairs:>6} {layers:>6} {1e3 * r['triton_ms']:>10.1f} {r['triton_GBps']:>7.0f} "
                  f"{r['triton_pct_roofline']:>5.1f}% {r['torch_GBps']:>10.0f} "
                  f"{r['triton_over_torch']:>9.2f}", flush=True)

    out = args.out or RESULTS / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "roofline": roof, "decode": decode,
                               "prefill": prefill, "store_kv": store,
                               "copy_blocks": copies}, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
