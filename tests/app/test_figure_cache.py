"""Figures are cached by the snapshots they draw (issue 14): the same snapshot objects give the
same figure object back; another snapshot, or text shown vs not, builds a new one."""
from app.figure_cache import FigureCache
from app.figures.pool_grid import pool_figure
from app.lab import Lab


def test_same_snapshot_reuses_the_figure_and_a_new_step_builds_one():
    lab = Lab.create("single")
    cache = lab.figures
    first = cache.get(pool_figure, lab.current(), lab.decode)
    assert cache.get(pool_figure, lab.current(), lab.decode) is first      # a rerun, same step
    assert (cache.hits, cache.misses) == (1, 1)
    lab.step()
    second = cache.get(pool_figure, lab.current(), lab.decode)
    assert second is not first and "step 1" in second.layout.title.text
    lab.back()                                                              # scrub back
    assert cache.get(pool_figure, lab.current(), lab.decode) is first
    assert cache.get(pool_figure, lab.current(), None) is not first          # no token text


def test_the_cache_is_bounded_and_cleared_with_the_engine():
    calls = []

    def build(snap):
        calls.append(snap)
        return object()

    cache = FigureCache(capacity=3)
    keep = [object() for _ in range(5)]
    for s in keep:
        cache.get(build, s)
    assert len(cache) == 3 and len(calls) == 5
    cache.get(build, keep[0])                      # evicted: built again
    assert len(calls) == 6
    lab = Lab.create("single")
    lab.figures.get(pool_figure, lab.current(), lab.decode)
    assert len(lab.figures) == 1
    assert lab.apply(lab.settings)                 # a rebuilt engine draws new snapshots
    assert len(lab.figures) == 0


def test_an_entry_does_not_keep_the_decode_function():
    lab = Lab.create("single")
    decode = lab.decode
    lab.figures.get(pool_figure, lab.current(), decode)
    held = [a for args, _ in lab.figures._entries.values() for a in args]
    assert decode not in held and lab.current() in held
