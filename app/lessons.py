"""Guided lessons: checkpoints that step the real engine until something happens, then ask.

A lesson is data: a scenario preset (run under vLLM v0 or v1) and 4–8 checkpoints. A checkpoint
has a short text of what to watch, a *condition* on the snapshots (``until``) that **Next**
steps the engine towards, and a question whose answer is computed from the engine's state at
that moment. Conditions look at events and counts, never at step numbers, so a lesson still
works after the student edits the prompt; a condition that does not come before the requests
finish is reported, not waited for. Nothing here imports Streamlit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from engine import StepSnapshot

# ---- conditions: predicates on (snapshot, the one before it) -------------------------------
Condition = Callable[[StepSnapshot, "StepSnapshot | None"], bool]


def has_event(kind: str) -> Condition:
    return lambda snap, prev: any(e.kind == kind for e in snap.events)


def step_kind(kind: str) -> Condition:
    return lambda snap, prev: snap.kind == kind


def all_finished(snap: StepSnapshot, prev) -> bool:
    return snap.kind != "init" and not snap.stats.num_running and not snap.stats.num_waiting \
        and not snap.stats.num_swapped


def new_block_after_full(snap: StepSnapshot, prev) -> bool:
    """A decode step allocated a fresh block because the sequence's last one was full."""
    return snap.kind in ("decode", "mixed") and any(
        e.kind == "alloc" and e.logical > 0 for e in snap.events)


def last_sharer_wrote_in_place(snap: StepSnapshot, prev) -> bool:
    """Copy-on-write copies happened and one writer kept the shared block (it was the last)."""
    copied = {e.src for e in snap.events if e.kind == "cow"}
    return bool(copied) and any(e.kind == "append" and e.physical in copied for e in snap.events)


def max_slab_holds_tokens(snap: StepSnapshot, prev) -> bool:
    acc = {a.allocator: a for a in snap.accounting}
    return "max" in acc and acc["max"].token_states > 0 and snap.kind == "decode"


def partial_chunk(snap: StepSnapshot, prev) -> bool:
    """A v1 prefill chunk that stops before the end of its prompt."""
    return any(e.kind == "prefill" and e.total is not None and e.end < e.total
               for e in snap.events)


# ---- answers: computed from the snapshot at the checkpoint ---------------------------------
def _first_live(snap: StepSnapshot):
    live = [s for s in snap.sequences if s.block_table]
    return min(live, key=lambda s: s.seq_id) if live else None


def blocks_of_first_seq(snap: StepSnapshot) -> int:
    s = _first_live(snap)
    return len(s.block_table) if s else 0


def slots_free_in_last_block(snap: StepSnapshot) -> int:
    s = _first_live(snap)
    if s is None:
        return 0
    return len(s.block_table) * snap.block_size - s.num_computed


def refcount_of_first_block(snap: StepSnapshot) -> int:
    s = _first_live(snap)
    if s is None:
        return 0
    return next(b.ref_count for b in snap.blocks if b.block_id == s.block_table[0])


def count_events(kind: str) -> Callable[[StepSnapshot], int]:
    return lambda snap: sum(1 for e in snap.events if e.kind == kind)


def shared_blocks(snap: StepSnapshot) -> int:
    return snap.stats.shared_blocks


def free_blocks(snap: StepSnapshot) -> int:
    return snap.stats.free_blocks


def live_sequences(snap: StepSnapshot) -> int:
    return sum(1 for s in snap.sequences if s.status in ("running", "waiting", "swapped"))


def preempted_seq(snap: StepSnapshot) -> int:
    return next(e.seq_id for e in snap.events if e.kind == "preempt")


def prefix_hit_tokens(snap: StepSnapshot) -> int:
    return snap.stats.prefix_cache_hits


def max_slab_slots(snap: StepSnapshot) -> int:
    a = next(a for a in snap.accounting if a.allocator == "max")
    return a.token_states + a.reserved + a.internal_fragmentation


def paged_token_share_pct(snap: StepSnapshot) -> int:
    a = next(a for a in snap.accounting if a.allocator == "paged")
    return round(100 * a.token_state_share)


def paged_slots(snap: StepSnapshot) -> int:
    return snap.stats.used_blocks * snap.block_size


def prefill_tokens(snap: StepSnapshot) -> int:
    return sum(e.end - e.start for e in snap.events if e.kind == "prefill")


# ---- lessons -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    text: str
    answer: Callable[[StepSnapshot], int]
    explain: str = ""            # shown after answering: why the number is what it is


@dataclass(frozen=True)
class Checkpoint:
    text: str                    # what to watch, in plain words
    until_label: str             # what Next steps towards, e.g. "until the first copy-on-write"
    until: Condition
    question: Question | None = None
    # True: the moment must come after the previous checkpoint's step (else the same step may
    # satisfy both, e.g. the first copy-on-write and the last sharer writing in place)
    later: bool = False


@dataclass(frozen=True)
class Lesson:
    key: str
    title: str
    scenario: str                # app.scenarios preset the lesson runs
    semantics: str               # "v0" or "v1"
    checkpoints: tuple[Checkpoint, ...]


LESSONS: dict[str, Lesson] = {lesson.key: lesson for lesson in (
    Lesson("single", "1 · One sequence: blocks on demand", "single", "v0", (
        Checkpoint("The prompt is computed in one prefill step. Its tokens fill blocks in order; "
                   "only the last one may be partly empty.", "until the prefill",
                   step_kind("prefill"),
                   Question("How many physical blocks does the sequence hold now?",
                            blocks_of_first_seq, "ceil(prompt tokens / block size)")),
        Checkpoint("Each decode step writes one token's K/V into the last block. No new block "
                   "is needed while it has a free slot.", "until a decode step",
                   step_kind("decode"),
                   Question("How many slots of its blocks are still empty?",
                            slots_free_in_last_block,
                            "all empty slots are in the last block: paging wastes less than "
                            "one block per sequence")),
        Checkpoint("When the last block is full, the next token gets a fresh block from the "
                   "free list, wherever it is in the pool.", "until a new block is allocated",
                   new_block_after_full,
                   Question("How many blocks does the sequence hold now?", blocks_of_first_seq),
                   later=True),
        Checkpoint("The sequence runs to its max tokens and frees its blocks.",
                   "until it finishes", all_finished,
                   Question("How many blocks of the pool are free now?", free_blocks,
                            "every block came back to the free list")),
    )),
    Lesson("parallel", "2 · Parallel sampling: sharing and copy-on-write", "parallel", "v0", (
        Checkpoint("One prefill computes the prompt once; then the request forks into 4 "
                   "samples that share every prompt block.", "until the fork",
                   has_event("fork"),
                   Question("What is the refcount of the first prompt block?",
                            refcount_of_first_block, "4 block tables point at it")),
        Checkpoint("Each sample now writes its own token into the shared, partly filled last "
                   "block: before writing, a sharer gets a private copy (copy-on-write).",
                   "until the first copy-on-write", has_event("cow"),
                   Question("How many copy-on-write copies happened in this step?",
                            count_events("cow"),
                            "every writer but the last copies; the last writes in place")),
        Checkpoint("The last sharer of a block does not copy: it writes in place.",
                   "until the last sharer writes in place", last_sharer_wrote_in_place,
                   Question("How many blocks are shared (refcount > 1) now?", shared_blocks,
                            "the full prompt blocks stay shared: full blocks are never written")),
        Checkpoint("The samples finish and release their blocks; shared blocks return to the "
                   "free list only when their last reference goes.", "until they finish",
                   all_finished,
                   Question("How many blocks are free now?", free_blocks)),
    )),
    Lesson("beam", "3 · Beam search: forks, pruning, a tree", "beam", "v0", (
        Checkpoint("After the prefill the best candidates fork from the prompt's sequence and "
                   "share its blocks.", "until the first fork", has_event("fork"),
                   Question("How many live sequences (beams) are there now?", live_sequences)),
        Checkpoint("A beam whose extensions all lose is pruned: its blocks are released in the "
                   "same step.", "until a beam is pruned", has_event("beam_prune"),
                   Question("How many beams were pruned in this step?",
                            count_events("beam_prune"))),
        Checkpoint("Surviving beams fork again; a fork that writes into a shared block copies "
                   "it first.", "until a copy-on-write", has_event("cow"),
                   Question("How many copy-on-write copies happened in this step?",
                            count_events("cow"))),
        Checkpoint("The search ends; the tree tab shows which beams lived and died.",
                   "until it finishes", all_finished,
                   Question("How many blocks are free now?", free_blocks)),
    )),
    Lesson("prefix", "4 · Shared prefix: found by hash", "prefix", "v0", (
        Checkpoint("The first request computes its prompt; its full blocks enter the prefix "
                   "cache under a hash of all tokens so far.", "until a block is cached",
                   has_event("cached"),
                   Question("How many full blocks entered the prefix cache in this step?",
                            count_events("cached"))),
        Checkpoint("The next requests start with the same tokens: their leading full blocks "
                   "are found by hash and reused, not recomputed.", "until a prefix-cache hit",
                   has_event("prefix_hit"),
                   Question("How many prefix-cache hits did this step have (one per block, "
                            "per request that reused it: the narration lists them)?",
                            count_events("prefix_hit"),
                            "a block reused by two requests counts twice, though the pool "
                            "holds it once")),
        Checkpoint("Reused blocks are shared (refcount > 1) like forked ones.",
                   "until a decode step", step_kind("decode"),
                   Question("How many blocks are shared now?", shared_blocks), later=True),
        Checkpoint("At the end, cached blocks stay in the free list with their content until "
                   "reallocated.", "until all finish", all_finished,
                   Question("How many prompt tokens were served from the cache in total (the "
                            "prefix-cache hits metric above the tabs)?", prefix_hit_tokens)),
    )),
    Lesson("waste", "5 · Contiguous slabs vs pages", "single", "v0", (
        Checkpoint("Paging gives the prompt just the blocks it fills.", "until the prefill",
                   step_kind("prefill"),
                   Question("How many KV slots does paging hold now (blocks × block size)?",
                            paged_slots)),
        Checkpoint("A contiguous allocator (Orca-style Max) reserves max_model_len slots for the "
                   "sequence up front, before it has generated anything. Open the Waste tab.",
                   "until the Max slab holds tokens", max_slab_holds_tokens,
                   Question("How many slots does the Max slab reserve?", max_slab_slots,
                            "max_model_len slots per sequence, whatever its length")),
        Checkpoint("Paging allocates one block at a time, so its waste is at most the unfilled "
                   "part of the last block.", "until a new block is allocated",
                   new_block_after_full,
                   Question("What percentage of the paged memory holds token states now "
                            "(rounded)?", paged_token_share_pct), later=True),
        Checkpoint("At the end the sequence has its full length: compare the slab with the "
                   "slots paging used.", "until it finishes", all_finished, None),
    )),
    Lesson("preemption", "6 · Preemption: when the pool runs dry", "mixed", "v0", (
        Checkpoint("Five requests compete for a small pool. They are admitted while the pool "
                   "holds their prompts.", "until the prefill", step_kind("prefill"),
                   Question("How many blocks are free after the prefill?", free_blocks)),
        Checkpoint("A decode step needs a free block for each running sequence (vLLM v0's "
                   "worst case); when there is none, the newest sequence is preempted: its "
                   "blocks are freed and it will be recomputed.",
                   "until a preemption", has_event("preempt"),
                   Question("Which sequence was preempted first in this step?", preempted_seq,
                            "the latest to arrive loses its blocks first")),
        Checkpoint("Blocks free up as others finish; a preempted request is admitted again "
                   "and its prompt and generated tokens are computed once more.",
                   "until the next prefill", step_kind("prefill"),
                   Question("How many tokens did this prefill compute, all the sequences it "
                            "prefilled together?", prefill_tokens,
                            "the sum of the K/V ranges the narration lists for this step"),
                   later=True),
        Checkpoint("Preemption never changes outputs: the request is recomputed later.",
                   "until all finish", all_finished,
                   Question("How many blocks are free now?", free_blocks)),
    )),
    Lesson("v1", "7 · vLLM v1: one token budget per step", "single", "v1", (
        Checkpoint("vLLM v1 has no prefill or decode steps: each step has a budget of tokens. "
                   "A prompt longer than the budget is computed in chunks.",
                   "until a partial prompt chunk", partial_chunk,
                   Question("How many prompt tokens did this step compute?", prefill_tokens,
                            "at most the step's token budget (max_num_batched_tokens)")),
        Checkpoint("The request samples its first token only once its whole prompt is computed.",
                   "until the first sample", has_event("sample"),
                   Question("How many blocks does the sequence hold now?", blocks_of_first_seq),
                   later=True),
        Checkpoint("Block 0 is v1's null block: it is never handed out.", "until a decode step",
                   step_kind("decode"),
                   Question("How many blocks are free now (the null block is not free)?",
                            free_blocks), later=True),
        Checkpoint("It runs to the end and frees its blocks.", "until it finishes",
                   all_finished, None),
    )),
)}


# ---- a lesson in progress ------------------------------------------------------------------
@dataclass
class LessonRun:
    """Where a student is in a lesson, on a Lab's engine (steps it with ``lab.step``)."""
    lesson: Lesson
    index: int = -1              # checkpoint reached (-1: not started)
    reached: StepSnapshot | None = None
    missed: str | None = None    # the condition that never came, if any
    answered: bool | None = None # None: not answered; True/False: last answer right

    MAX_STEPS = 500

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self.lesson.checkpoints[self.index] if 0 <= self.index < len(self.lesson.checkpoints) \
            else None

    @property
    def next_checkpoint(self) -> Checkpoint | None:
        i = self.index + 1
        return self.lesson.checkpoints[i] if i < len(self.lesson.checkpoints) else None

    @property
    def done(self) -> bool:
        return self.index == len(self.lesson.checkpoints) - 1 and self.missed is None

    def next(self, lab) -> bool:
        """Step ``lab`` until the next checkpoint's condition holds (it may hold already, at the
        snapshot shown). False, with ``missed`` set, if the requests finish before it does."""
        cp = self.next_checkpoint
        if cp is None:
            return False
        self.missed, self.answered = None, None
        for _ in range(self.MAX_STEPS):
            snap, prev = lab.current(), lab.previous()
            fresh = self.reached is None or snap.index > self.reached.index or \
                (not cp.later and snap.index == self.reached.index)
            if snap is not None and snap.kind != "init" and fresh and cp.until(snap, prev):
                self.index += 1
                self.reached = snap
                return True
            if not lab.step():
                break
        self.missed = (f"“{cp.until_label}” did not happen before the requests finished "
                       "(the settings may have changed what happens). Reset to try again.")
        return False

    def expected(self) -> int | None:
        cp = self.checkpoint
        if cp is None or cp.question is None or self.reached is None:
            return None
        return int(cp.question.answer(self.reached))

    def check(self, answer) -> bool:
        """Is ``answer`` (a whole number, alone or in text such as "3 blocks") what the engine's
        state says?"""
        found = re.findall(r"-?\d+(?:\.\d+)?", str(answer))
        if len(found) != 1 or not float(found[0]).is_integer():
            self.answered = False
            return False
        given = int(float(found[0]))
        self.answered = given == self.expected()
        return self.answered
