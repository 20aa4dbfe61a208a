"""vLLM v0's own scheduler and block manager (vLLM 0.8.5), driven on lengths, in a subprocess.

vLLM 0.8.5 is the last release with the v0 engine. Its compiled library needs a newer
libstdc++ than Debian 12's, but ``vllm.core.scheduler.Scheduler`` and the block manager are
pure Python and run without it, so the wheel's files are unpacked (``deploy/install_vllm.sh``
puts them in ``.vllm-v0/``; no binary is patched) and put first on ``sys.path`` of a separate
process (they cannot share a process with the vLLM 0.32 the rest of real_vllm uses).

The driver reads a workload (or a list of them) as JSON on stdin -- the scheduler settings and requests (prompt
length, max_tokens, arrival step, n: an n > 1 request is forked after its prefill, as vLLM up to
0.6 and our v0 do) -- and plays the model's part: it updates computed tokens, appends a token
to each running sequence, forks, finishes a sequence at max_tokens, as vLLM v0's LLMEngine does
after each step. It prints one JSON view per step: the step's kind, the groups scheduled with
their token counts, the groups preempted (in order), every live sequence's block table, free
device blocks, and the swap and copy mappings.

Run: ``python -m real_vllm.v0_reference DIR < workload.json`` (DIR: the unpacked wheel).
"""
from __future__ import annotations

import json
import sys
import time

SUPPORTED_V0 = "0.8.5"
IMPORT_FAILED = 3          # the exit status when its Python files cannot be imported here


def run(workload: dict) -> list[dict]:
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler
    from vllm.inputs import token_inputs
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

    c = workload["config"]
    cache = CacheConfig(block_size=c["block_size"], gpu_memory_utilization=0.9, swap_space=0,
                        cache_dtype="auto")
    cache.num_gpu_blocks, cache.num_cpu_blocks = c["num_gpu_blocks"], c["num_cpu_blocks"]
    sched = Scheduler(
        SchedulerConfig(runner_type="generate", max_num_batched_tokens=c["max_num_batched_tokens"],
                        max_num_seqs=c["max_num_seqs"], max_model_len=c["max_model_len"],
                        enable_chunked_prefill=False, preemption_mode=c["preemption_mode"]),
        cache, None)
    preempted: list[str] = []
    original_preempt = sched._preempt

    def caught_preempt(seq_group, *a, **k):
        preempted.append(seq_group.request_id)
        return original_preempt(seq_group, *a, **k)
    sched._preempt = caught_preempt

    requests = sorted(workload["requests"], key=lambda r: r["arrival_step"])
    next_id = 0
    order: dict[int, tuple[str, int]] = {}       # vLLM seq id -> (request, index in request)
    groups: dict[str, SequenceGroup] = {}
    views = []
    step = 0
    while step < workload.get("max_steps", 500):
        for r in requests:
            if r["arrival_step"] == step:
                seq = Sequence(next_id, token_inputs(list(r["prompt"])), c["block_size"])
                order[next_id] = (r["id"], 0)
                next_id += 1
                g = SequenceGroup(r["id"], [seq], time.time(),
                                  sampling_params=SamplingParams(max_tokens=r["max_tokens"],
                                                                 ignore_eos=True))
                groups[r["id"]] = g
                sched.add_seq_group(g)
        if not sched.has_unfinished_seqs() and all(r["arrival_step"] < step for r in requests):
            break
        preempted.clear()
        _, out, _ = sched.schedule()
        kind = ("prefill" if out.num_prefill_groups else
                "decode" if out.scheduled_seq_groups else "idle")
        scheduled = [[s.seq_group.request_id, s.token_chunk_size]
                     for s in out.scheduled_seq_groups]
        for s in out.scheduled_seq_groups:
            g = s.seq_group
            g.update_num_computed_tokens(s.token_chunk_size)
            n = next(r["n"] for r in requests if r["id"] == g.request_id)
            running = g.get_seqs(status=SequenceStatus.RUNNING)
            if n > 1 and len(g.seqs) == 1:          # the first sample: fork the n - 1 others
                parent = running[0]
                for i in range(1, n):
                    child = parent.fork(next_id)
                    order[next_id] = (g.request_id, i)
                    next_id += 1
                    # vLLM <= 0.6's SequenceGroup.add (0.8.5 no longer forks, so dropped it)
                    g.seqs.append(child)
                    g.seqs_dict[child.seq_id] = child
                    g.is_single_seq = False
                    sched.fork_seq(parent, child)
                running = g.get_seqs(status=SequenceStatus.RUNNING)
            for seq in running:
                seq.append_token_id(7, {7: Logprob(0.0)})
                if seq.get_output_len() >= g.sampling_params.max_tokens \
                        or seq.get_len() >= c["max_model_len"]:
                    seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                    sched.free_seq(seq)
        sched.free_finished_seq_groups()
        tables = {}
        for g in groups.values():
            for seq in g.get_seqs():
                if not seq.is_finished() and seq.seq_id in sched.block_manager.block_tables:
                    table = sched.block_manager.block_tables[seq.seq_id]
                    if table.physical_block_ids and seq.status == SequenceStatus.RUNNING:
                        rid, i = order[seq.seq_id]
                        tables[f"{rid}/{i}"] = list(table.physical_block_ids)
        step += 1
        views.append({"step": step, "kind": kind, "scheduled": scheduled,
                      "preempted": list(preempted), "block_tables": tables,
                      "free_blocks": sched.block_manager.get_num_free_gpu_blocks(),
                      "swap_out": sorted(map(list, out.blocks_to_swap_out)),
                      "swap_in": sorted(map(list, out.blocks_to_swap_in)),
                      "copies": sorted(map(list, out.blocks_to_copy))})
    return views


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import logging
    logging.disable(logging.WARNING)
    try:
        import vllm
        import vllm.core.scheduler                                   # noqa: F401
    except ImportError as e:       # a package vLLM 0.8.5 needs is missing here
        print(f"cannot import vLLM {SUPPORTED_V0}'s scheduler: {type(e).__name__}: {e}",
              file=sys.stderr)
        raise SystemExit(IMPORT_FAILED)
    if not vllm.__version__.startswith(SUPPORTED_V0):
        raise SystemExit(f"found vLLM {vllm.__version__} in {sys.argv[1]}; the driver reads "
                         f"vLLM {SUPPORTED_V0}'s v0 scheduler")
    workloads = json.load(sys.stdin)          # one workload, or a list of them
    if isinstance(workloads, list):
        json.dump([run(w) for w in workloads], sys.stdout)
    else:
        json.dump(run(workloads), sys.stdout)


if __name__ == "__main__":
    main()
