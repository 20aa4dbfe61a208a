"""The first Triton kernels (decode with one page-id load per token; prefill with one program
per query head), kept selectable as ``backend="triton-legacy"`` until a GPU run has confirmed
the kernels that replaced them (paged_kernels/triton_decode.py, paged_kernels/triton_prefill.py). They are
still tested against the torch reference under the interpreter."""
