"""app/turns.py: sessions of one process take turns in arrival order, re-entrantly, and long
work hands the turn on (real threads, no sleeps standing in for ordering: each thread says when
it waits, and the test waits for that before starting the next)."""
import threading
import time

import pytest

from app.turns import Turns


def _wait_until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def _queued(turns: Turns) -> int:
    with turns._mutex:
        return len(turns._waiting)


def test_turns_are_granted_in_arrival_order_and_one_at_a_time():
    turns, order, inside = Turns(), [], []
    turns.acquire()                              # the main thread holds the turn
    threads = []
    for i in range(6):
        def work(i=i):
            with turns:
                inside.append(i)
                assert len(inside) == 1          # nobody else holds it meanwhile
                order.append(i)
                inside.remove(i)
        t = threading.Thread(target=work)
        t.start()
        threads.append(t)
        _wait_until(lambda: _queued(turns) == i + 1)   # queued before the next one starts
    turns.release()
    for t in threads:
        t.join(10)
    assert order == list(range(6))
    assert turns._owner is None and turns._depth == 0


def test_a_thread_may_take_its_turn_again_and_releases_it_at_the_outermost_exit():
    turns, got = Turns(), threading.Event()
    with turns:
        with turns:
            pass
        t = threading.Thread(target=lambda: (turns.acquire(), got.set(), turns.release()))
        t.start()
        _wait_until(lambda: _queued(turns) == 1)
        assert not got.is_set()                  # still ours after the inner exit
    t.join(10)
    assert got.is_set()


def test_pass_turn_lets_the_waiting_go_first_then_goes_on_at_the_same_depth():
    turns, order = Turns(), []
    turns.acquire()
    turns.acquire()                              # depth 2, as nested in_use
    t = threading.Thread(target=lambda: (turns.acquire(), order.append("other"),
                                         turns.release()))
    t.start()
    _wait_until(lambda: _queued(turns) == 1)
    turns.pass_turn()
    order.append("me")
    assert order == ["other", "me"]
    turns.release()
    assert turns._owner == threading.get_ident()  # one level still held
    turns.release()
    assert turns._owner is None
    t.join(10)


def test_pass_turn_without_waiters_keeps_the_turn():
    turns = Turns()
    with turns:
        turns.pass_turn()
        assert turns._owner == threading.get_ident() and turns._depth == 1


def test_paused_work_lets_others_in_and_gets_the_turn_back():
    turns, ran = Turns(), threading.Event()
    with turns:
        with turns.paused():
            t = threading.Thread(target=lambda: (turns.acquire(), ran.set(), turns.release()))
            t.start()
            assert ran.wait(10)                  # the other ran while this one was paused
        assert turns._owner == threading.get_ident() and turns._depth == 1
    t.join(10)


def test_releasing_a_turn_not_held_is_an_error():
    turns = Turns()
    with pytest.raises(RuntimeError, match="does not hold it"):
        turns.release()


def test_a_lab_in_use_holds_the_process_turn_unless_the_operator_turned_it_off(monkeypatch):
    from app.lab import Lab
    from app.turns import TURNS
    lab = Lab.create()
    with lab.in_use():
        assert TURNS._owner == threading.get_ident()
        with lab.in_use():                       # nested, as a callback inside a page run
            assert TURNS._depth == 2
    assert TURNS._owner is None
    monkeypatch.setenv("PAGED_LAB_TAKE_TURNS", "0")
    with lab.in_use():
        assert TURNS._owner is None


def test_the_setting_must_be_0_or_1(monkeypatch):
    from app.hosting import take_turns
    monkeypatch.setenv("PAGED_LAB_TAKE_TURNS", "yes")
    with pytest.raises(ValueError, match="PAGED_LAB_TAKE_TURNS must be 0 or 1, got 'yes'"):
        take_turns()
    monkeypatch.delenv("PAGED_LAB_TAKE_TURNS")
    assert take_turns()
