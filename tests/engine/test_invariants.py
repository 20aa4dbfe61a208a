"""``check_invariants`` catches each broken rule: a real engine state, one thing corrupted, and
the AssertionError names the invariant."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.core import invariants as inv
from engine.core.hashing import hash_block
from engine.core.sequence import SeqStatus

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def broken(eng: Engine, name: str) -> None:
    with pytest.raises(AssertionError, match=f"invariant '{name}' broken"):
        eng.check_invariants()


@pytest.fixture
def cached():
    """Request 0 finished (its full blocks cached and free); request 1 running with hashed blocks
    in use; request 2 waiting."""
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16, max_num_seqs=1,
                                          enable_prefix_caching=True))
    eng.add_request(list(range(1, 10)), SamplingParams(max_tokens=3, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    eng.add_request(list(range(20, 30)), PARAMS)
    eng.add_request(list(range(40, 45)), PARAMS)
    eng.step()
    eng.check_invariants()
    return eng


@pytest.fixture
def swapped():
    """Three requests outgrow a 14-block pool: some are swapped out, some running."""
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=14, num_cpu_blocks=32,
                                          preemption_mode="swap"))
    for p in ([1, 2, 3, 4, 5], list(range(10, 17)), list(range(40, 48))):
        eng.add_request(p, PARAMS)
    while not eng.scheduler.swapped:
        eng.step()
        eng.check_invariants()
    return eng


def seq_in(queue):
    return queue[0].seqs[0]


def cached_free_block(pool) -> int:
    return next(b for b in range(pool.num_blocks) if pool.block_hash[b] and not pool.ref_count[b])


def test_the_states_are_sound(cached, swapped):
    gpu = cached.bm.gpu
    assert cached_free_block(gpu) is not None
    assert any(gpu.block_hash[b] for b in seq_in(cached.scheduler.running).block_table)
    assert cached.scheduler.waiting and swapped.scheduler.running


# ---- the prefix cache is sound --------------------------------------------------------------
def test_a_cached_free_block_whose_tokens_changed(cached):
    gpu = cached.bm.gpu
    gpu.tokens[cached_free_block(gpu)][0] += 1
    broken(cached, inv.HASH_CHAIN)


def test_a_cached_free_block_with_a_wrong_parent_hash(cached):
    gpu = cached.bm.gpu
    gpu.parent_hash[cached_free_block(gpu)] = hash_block("", [0, 0, 0, 0])
    broken(cached, inv.HASH_CHAIN)


def test_an_in_use_block_cached_under_another_prefix(cached):
    # self-consistent in the pool (hash = H(parent, tokens), map agrees), but chained from a
    # prefix the sequence does not have: a prefix hit on it would serve the wrong K/V
    gpu = cached.bm.gpu
    s = seq_in(cached.scheduler.running)
    b = s.block_table[1]
    assert gpu.block_hash[b] == s.block_hashes[1]
    other = hash_block("", [63, 63, 63, 63])
    new = hash_block(other, gpu.tokens[b])
    del gpu.cached[gpu.block_hash[b]]
    gpu.cached[new] = b
    gpu.block_hash[b], gpu.parent_hash[b] = new, other
    broken(cached, inv.HASH_CHAIN)


def test_a_sequence_hash_chain_that_does_not_match_its_tokens(cached):
    s = seq_in(cached.scheduler.running)
    s.block_hashes[0] = hash_block("", [0, 0, 0, 0])
    broken(cached, inv.HASH_CHAIN)


# ---- the cache map and block hashes agree ---------------------------------------------------
def test_a_hashed_block_missing_from_the_cache_map(cached):
    gpu = cached.bm.gpu
    del gpu.cached[gpu.block_hash[cached_free_block(gpu)]]
    broken(cached, inv.CACHE_MAP)


def test_a_cache_map_entry_for_a_block_with_another_hash(cached):
    gpu = cached.bm.gpu
    gpu.cached[hash_block("", [0, 0, 0, 0])] = cached_free_block(gpu)
    broken(cached, inv.CACHE_MAP)


# ---- statuses match queues ------------------------------------------------------------------
def test_a_running_request_in_the_waiting_queue(cached):
    sch = cached.scheduler
    sch.waiting.insert(0, sch.running.pop())
    broken(cached, inv.STATUS_QUEUE)


def test_a_running_sequence_marked_swapped(cached):
    seq_in(cached.scheduler.running).status = SeqStatus.SWAPPED
    broken(cached, inv.STATUS_QUEUE)


def test_a_finished_request_still_queued(cached):
    cached.scheduler.running.append(cached.groups["0"])
    broken(cached, inv.STATUS_QUEUE)


def test_a_finished_sequence_still_live(cached):
    seq_in(cached.scheduler.waiting).status = SeqStatus.FINISHED
    broken(cached, inv.STATUS_QUEUE)


def test_a_request_in_two_queues(swapped):
    sch = swapped.scheduler
    sch.running.append(sch.swapped[0])
    broken(swapped, inv.STATUS_QUEUE)


# ---- no pending copies between steps --------------------------------------------------------
def test_a_copy_left_pending(cached):
    cached.bm.pending_copies.append((0, 1))
    broken(cached, inv.NO_PENDING_COPIES)


# ---- swapped tables on the CPU pool, running ones on the GPU pool ---------------------------
def test_a_swapped_sequence_whose_table_says_gpu(swapped):
    seq_in(swapped.scheduler.swapped).block_device = "gpu"
    broken(swapped, inv.TABLE_POOL)


def test_a_running_sequence_whose_table_says_cpu(swapped):
    seq_in(swapped.scheduler.running).block_device = "cpu"
    broken(swapped, inv.TABLE_POOL)


def test_a_swapped_sequence_pointing_at_a_free_cpu_block(swapped):
    cpu = swapped.bm.cpu
    s = seq_in(swapped.scheduler.swapped)
    s.block_table[0] = next(iter(cpu.free_queue))
    broken(swapped, inv.TABLE_POOL)
