"""A worker stops at once when asked (docs/REFERENCE.md, Commands: `flask shop worker`): RQ's
teardown unsubscribes from the worker's control channel, then stops that channel's thread and
waits for it, and a platform sends SIGKILL 30 s after SIGTERM."""

from __future__ import annotations

import threading

from shop import queue
from shop.queue.worker import PUBSUB_WAKE_SECONDS
from support import wait_until


def test_a_worker_whose_channel_thread_already_saw_the_unsubscription_stops_within_seconds(fresh_ctx):
    """The race RQ's teardown loses on a busy machine, made certain: the thread reads the
    unsubscription's reply before it is told to stop, and goes back to waiting for a subscription.
    It must look again within a second or so, not after RQ's 60 s."""
    worker = queue.make_worker(name="stop-test-worker")
    worker.subscribe()
    worker.pubsub.unsubscribe()
    wait_until(lambda: not worker.pubsub.subscribed, 10, "the channel's thread to read the unsubscription")
    stopped = threading.Event()

    def teardown() -> None:
        worker.unsubscribe()
        stopped.set()

    # The thread looks whether it should stop every PUBSUB_WAKE_SECONDS, not RQ's 60 s: the
    # teardown below then ends well before the wait gives up.
    assert worker.pubsub_thread.sleep_time == PUBSUB_WAKE_SECONDS == 1.0
    threading.Thread(target=teardown, daemon=True).start()
    assert stopped.wait(10), "the worker's channel thread did not stop within 10 s (RQ's own waits 60 s)"
    assert not worker.pubsub_thread.is_alive()
