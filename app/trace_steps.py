"""A trace's step numbers as the engine records them (issue 45: traces numbered 0, 3, 2, 1,
all 5, or negative replayed unflagged). The first snapshot's step is any step >= 0 (a history
keeps its last 400 steps); each snapshot after it is the next step, except an abort or a
prefix-cache reset, which is recorded under the step before it (no step ran)."""
from __future__ import annotations

NOT_A_STEP = ("abort", "reset")      # snapshot kinds recorded between steps (engine/observe)


def first_step_violation(snapshots) -> str | None:
    """Why the step numbers cannot be a recorded history (the first bad snapshot), or None."""
    first = snapshots[0].step
    if first < 0:
        return f"snapshot 0 has step {first}: steps are numbered from 0"
    for i in range(1, len(snapshots)):
        prev, snap = snapshots[i - 1].step, snapshots[i]
        want = prev if snap.kind in NOT_A_STEP else prev + 1
        if snap.step != want:
            what = (f"an {snap.kind} is recorded under the step before it ({prev})"
                    if snap.kind in NOT_A_STEP else
                    f"a trace has one snapshot per step, each the step after the one before "
                    f"({prev} + 1 = {prev + 1})")
            return f"snapshot {i} has step {snap.step}: {what}"
    return None
