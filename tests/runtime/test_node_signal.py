"""A node's SIGTERM handler must not deadlock with the node's own shutdown (an orphan node otherwise)."""

from __future__ import annotations

import threading

from dualpath.runtime.node import stop_from_signal


def test_a_signal_during_the_nodes_own_stop_set_does_not_block() -> None:
    """The handler runs on the main thread between bytecodes; here that thread holds the event's lock,
    as it does inside `stop.set()`. Setting the event directly would wait for ever; the handler returns
    at once and the event is set as soon as the lock is free."""
    stop = threading.Event()
    with stop._cond:  # noqa: SLF001 - the lock `Event.set` takes
        done = threading.Event()
        caller = threading.Thread(target=lambda: (stop_from_signal(stop), done.set()), daemon=True)
        caller.start()
        assert done.wait(timeout=5.0)  # returned while the lock is held
        assert not stop.is_set()
    assert stop.wait(timeout=5.0)
