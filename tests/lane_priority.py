"""Servers a test stands up inside its own process stand for other machines: the Stripe sandbox,
a webhook receiver, the shop served over HTTP. They must not queue for a core behind the test
thread that calls them, or a loaded machine turns the test's 5 s of patience into a product
failure that no real provider would cause.

scripts/test starts every lane at its own priority and asks the busy in-process lanes to run 10
lower (BACKSTOP_TEST_NICENESS): on Linux the nice value belongs to a thread, and anyone may lower
a thread's priority but only a privileged process may raise it again. So before the test thread
lowers its own, it starts one thread that keeps the lane's priority, and every server is started
from that thread (`serving`): the server's threads, and the threads they start in turn (one per
request, the sandbox's clock and deliveries), are born at the lane's priority."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ContextManager, TypeVar

T = TypeVar("T")
NICENESS_VARIABLE = "BACKSTOP_TEST_NICENESS"


def thread_niceness() -> int:
    """The calling thread's own nice value."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class LanePriority:
    """A starter thread at the priority of the thread that made this, which may then step down."""

    def __init__(self) -> None:
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lane-priority")
        self._starter.submit(lambda: None).result()  # born now, before any step down

    def step_down(self, by: int) -> None:
        """Lower the calling thread's priority by `by` (its later threads and children inherit it)."""
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), thread_niceness() + by)

    def started(self, start: Callable[[], T]) -> T:
        """`start()`, called on the starter thread: the threads it starts keep the lane's priority."""
        return self._starter.submit(start).result()

    @contextlib.contextmanager
    def serving(self, server: Callable[[], ContextManager[T]]) -> Iterator[T]:
        """Make and enter `server()` on the starter thread, leave it on this one."""
        with contextlib.ExitStack() as stack:
            yield self.started(lambda: stack.enter_context(server()))


_lane: LanePriority | None = None


def step_down_from_environment() -> None:
    """At the start of a run: the test thread steps down by BACKSTOP_TEST_NICENESS, if set."""
    global _lane
    by = int(os.environ.get(NICENESS_VARIABLE) or 0)
    if by > 0 and _lane is None:
        _lane = LanePriority()
        _lane.step_down(by)


def serving(server: Callable[[], ContextManager[T]]) -> ContextManager[T]:
    """`with serving(WebhookReceiver) as receiver:`: the server (made by `server()`) runs at the
    lane's priority; the same as `with server() as ...` in a run that did not step down."""
    return _lane.serving(server) if _lane is not None else server()


def start_thread(target: Callable[..., object], **kwargs: object) -> threading.Thread:
    """A started daemon thread running `target(**kwargs)` at the lane's priority: a server's loop."""

    def start() -> threading.Thread:
        thread = threading.Thread(target=target, kwargs=kwargs, daemon=True)
        thread.start()
        return thread

    return _lane.started(start) if _lane is not None else start()
