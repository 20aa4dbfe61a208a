"""The first Triton kernels (decode with one page-id load per token; prefill with one program
per query head): no engine backend, but the baseline bench/kernel_bench.py measures the kernels
that replaced them against (paged_kernels/triton_decode.py, paged_kernels/triton_prefill.py).
They are still tested against the torch reference under the interpreter."""
