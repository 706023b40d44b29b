"""The local transport's order (`hacrl.driver.backends.local`): a call to a worker in the driver's process runs
when its value is first needed, after every call sent before it; before the driver waits on another process
(a sampler of its own, a worker group) it runs every call sent, so that process works meanwhile. Fakes stand for
the workers and processes: what is checked is the order, which the lag and sampler tests rely on."""

from __future__ import annotations

from collections import deque


def _transport(monkeypatch, order: list):
    from hacrl.driver.backends import local

    class Worker:
        def __init__(self, name: str) -> None:
            self.name = name

        def work(self, x):
            order.append((self.name, x))
            return x * 2

        def fail(self):
            order.append((self.name, "fail"))
            raise ValueError("no")

    class Reply:  # what `ranks.Reply` is to the transport: a process's answer, waited for in `value`
        def __init__(self, what: str) -> None:
            self.what, self.taken = what, False

        def value(self):
            order.append(("waited", self.what))
            self.taken = True
            return self.what

    class Processes:
        def submit(self, method, args, what):
            order.append(("sent", what))
            return Reply(what)

        def close(self, force=False):
            order.append(("closed", force))

    monkeypatch.setattr(local, "LocalProcesses", Processes)
    monkeypatch.setattr(local, "Reply", Reply)
    transport = object.__new__(local.LocalTransport)
    transport.names, transport._queue = ["a", "b"], deque()
    transport.learners, transport.samplers = [Worker("a"), Worker("b")], [Processes(), None]
    return transport


def test_in_process_calls_run_when_needed_in_send_order_and_before_a_wait_on_a_process(monkeypatch):
    order: list = []
    t = _transport(monkeypatch, order)
    a = t.submit(0, "learner", "work", (1,), "a's first")
    b = t.submit(1, "learner", "work", (2,), "b's first")
    s = t.submit(0, "sampler", "sample", (), "a's sampler")  # to a process: sent at once
    assert order == [("sent", "a's sampler")]  # the in-process calls wait until a value is needed
    assert t.gather([b]) == [4] and order[1:] == [("a", 1), ("b", 2)]  # b's after a's, sent first
    c = t.submit(0, "learner", "work", (3,), "a's second")
    assert t.gather([s]) == ["a's sampler"]
    assert order[3:] == [("a", 3), ("waited", "a's sampler")]  # the driver's own work before the wait
    assert t.gather([a, c]) == [2, 6] and len(order) == 5  # each ran once
    d = t.submit(1, "learner", "work", (c,), "b with a's value")  # a handle as an argument: its value
    assert t.gather([d]) == [12]


def test_a_failed_call_raises_and_the_ones_after_it_never_run_once_closed(monkeypatch):
    """The first error is raised where it is gathered; a call sent after it has not run, and once the run stops
    (`close`: the run's error path) waiting on it says it was dropped, naming it, instead of running it late."""
    import pytest

    order: list = []
    t = _transport(monkeypatch, order)
    first = t.submit(0, "learner", "fail", (), "a failing")
    later = t.submit(1, "learner", "work", (5,), "b after it")
    with pytest.raises(ValueError, match="no"):
        t.gather([first, later])
    t.close(force=True)
    with pytest.raises(RuntimeError, match=r"dropped before it ran \(b after it\)"):
        later.value()
    assert order == [("a", "fail"), ("closed", True)]
