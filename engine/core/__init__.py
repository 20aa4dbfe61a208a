"""Memory: the physical block pool, block tables and the prefix cache's hashes.

``block_pool`` (refcounts, free queue, hash map) <- ``hashing`` (the one block hash) <-
``kv_cache_base`` (what both engines' managers share) <- ``block_manager`` (vLLM v0: fork,
copy-on-write, swap) / ``kv_cache_manager`` (vLLM v1: slots for a token budget, null block);
``sequence`` holds a request's tokens and table; ``invariants`` checks all of it.
"""
