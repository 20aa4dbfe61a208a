"""A block table carries the pool it points into (``Sequence.block_device``); ``pool_of`` reads
that, not the status, so a status changed early cannot make a free decref the other pool."""
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence, SeqStatus


def manager(caching: bool = False) -> BlockManager:
    return BlockManager(num_gpu_blocks=8, num_cpu_blocks=8, block_size=4,
                        enable_prefix_caching=caching, emit=lambda e: None)


def prefilled(bm: BlockManager, seq_id: int = 0, n: int = 6) -> Sequence:
    s = Sequence(seq_id, str(seq_id), list(range(1, n + 1)), n)
    bm.allocate_for_prefill(s)
    s.num_computed = n
    s.status = SeqStatus.RUNNING
    return s


def used(pool) -> int:
    return pool.num_blocks - pool.num_free


def test_the_block_manager_stores_the_pool_with_the_table():
    bm = manager()
    s = prefilled(bm)
    assert s.block_device == "gpu" and bm.pool_of(s) is bm.gpu
    child = Sequence(1, "0", list(s.token_ids), s.prompt_len, status=s.status)
    bm.fork(s, child)
    assert child.block_device == "gpu"
    bm.swap_out([s, child])
    assert s.block_device == child.block_device == "cpu" and bm.pool_of(s) is bm.cpu
    bm.swap_in([s, child])
    assert s.block_device == "gpu" and bm.pool_of(child) is bm.gpu
    bm.free(child)
    bm.free(s)
    assert s.block_device == "gpu" and used(bm.gpu) == used(bm.cpu) == 0


def test_pool_of_follows_the_stored_device_not_the_status():
    bm = manager()
    s = prefilled(bm)
    s.status = SeqStatus.SWAPPED            # a status that says cpu; the table is on the gpu
    assert bm.pool_of(s) is bm.gpu
    bm.swap_out([s])
    s.status = SeqStatus.RUNNING            # a status that says gpu; the table is on the cpu
    assert bm.pool_of(s) is bm.cpu


def test_a_swapped_sequence_marked_running_early_is_freed_from_the_cpu_pool():
    # e.g. code reordered so the status flips before the blocks move (or before an abort frees)
    bm = manager()
    other = prefilled(bm, 0)                 # holds gpu blocks 0, 1
    s = prefilled(bm, 1)                     # gpu blocks 2, 3
    bm.swap_out([s])
    assert used(bm.gpu) == 2 and used(bm.cpu) == 2
    s.status = SeqStatus.RUNNING
    bm.free(s)
    assert used(bm.cpu) == 0                 # its CPU blocks were released
    # and the GPU blocks with the same ids, another sequence's, kept their references
    assert used(bm.gpu) == 2 and all(bm.gpu.ref_count[b] == 1 for b in other.block_table)
