"""The "How to read this" text under each figure, by the key a view passes to ``how_to_read``."""
from __future__ import annotations

HOW_TO_READ: dict[str, str] = {
    "tables": "Each row is a live sequence; column *Lk* is its k-th logical block (tokens "
              "k·B … k·B+B−1). The cell names the **physical** block holding them: `P7 ×3` means "
              "block 7 of the pool, referenced by 3 tables (shared: orange). Blue = owned alone. "
              "Swapped sequences point into the CPU pool (`C3`, purple). Hover for the tokens.",
    "pool": "Every physical block of the pool, in id order. Grey = free, blue = used by one "
            "table, orange = shared (refcount > 1), green = free but still cached for prefix "
            "reuse, purple = CPU swap pool. A cell shows `rc` (refcount) and fill "
            "(filled/slots). Red arrows are this step's copy-on-write copies (shared source → "
            "private copy); purple arrows are swaps. Hover a cell for the tokens it holds.",
    "cow": "Before a sequence writes into a block that others also reference, the engine gives it "
           "a new block and copies the K/V there (copy-on-write). Full blocks are never written "
           "again, so they stay shared; only a partly filled shared block is copied, and the last "
           "sharer writes in place.",
    "text": "Each sequence's tokens, grouped by logical block: a band per block, labelled with the "
            "physical block (P…) that holds its K/V. Grey = prompt, black = generated. "
            "`·` is a space, `↵` a newline.",
    "timeline": "One lane per event kind; a dot per step, with the number of events of that kind. "
                "The shaded band marks the step shown. `append` = a token's K/V written into a "
                "block slot, `fork` = block table copied (refcounts +1), `cow` = a shared block "
                "copied before a write, `free` = a block's refcount reached 0.",
    "tree": "One line per sequence from the step it was born to the step it ended; a grey "
            "diagonal joins a forked child to its parent. Beam search keeps the best *width* "
            "candidates each step, scored as transformers' `generate(num_beams=...)` scores them "
            "(length_penalty, early_stopping); memory follows vLLM v0: survivors fork, pruned "
            "beams (dashed, ×) free their blocks, finished hypotheses end in a star.",
    "waste": "The same requests replayed on contiguous allocators (vLLM paper, Fig. 2): **Max** "
             "reserves the model's whole context per sequence, **Pow2** the next power of two ≥ "
             "prompt+output, **Oracle** exactly prompt+output. Slots are token states (hold a "
             "token now), reserved (will later), internal fragmentation (never will), external "
             "fragmentation (free but unusable), free. A request whose reservation does not fit "
             "waits (right); with Max in a small pool a request may never fit (marked *N never "
             "fit*: counted as rejected, not waiting). The paged "
             "pool's only waste is the slack in each sequence's last block.",
}
