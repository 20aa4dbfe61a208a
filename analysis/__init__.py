"""Analyses that drive the engine from above: synthetic workloads (``workloads``), replays of
its scheduler on lengths only (``length_replay``, ``contiguous_replay``) and the block-size
sweep (``block_size_sweep``). They import ``engine``; ``engine`` never imports them."""
