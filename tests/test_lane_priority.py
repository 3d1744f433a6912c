"""The servers a test stands up in its own process keep the lane's priority when the test thread
steps down (tests/lane_priority.py): on a machine whose cores are taken, a stepped-down thread
waits seconds for one, and a provider stand-in answering at that priority timed the shop out."""

from __future__ import annotations

import os
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lane_priority import NICENESS_VARIABLE, LanePriority, thread_niceness

STEP = 5


class _Recorder(BaseHTTPRequestHandler):
    seen: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self.seen.append(thread_niceness())
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _answering_niceness(start_server) -> tuple[int, int, int]:
    """In a thread of its own (this test's thread keeps its priority): step down, start a server
    with `start_server(priority, serve)`, ask it once; (before, the stepped-down thread's, the
    answering thread's) nice values."""
    found: dict[str, int] = {}

    def lane() -> None:
        found["before"] = thread_niceness()
        priority = LanePriority()
        priority.step_down(STEP)
        found["stepped"] = thread_niceness()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        _Recorder.seen = []
        start_server(priority, lambda: threading.Thread(target=server.serve_forever, daemon=True).start())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=30) as answer:
                assert answer.status == 204
        finally:
            server.shutdown()
            server.server_close()
        [found["answered"]] = _Recorder.seen

    thread = threading.Thread(target=lane)
    thread.start()
    thread.join()
    return found["before"], found["stepped"], found["answered"]


def test_a_server_started_through_the_lanes_starter_answers_at_the_priority_the_lane_had():
    before, stepped, answered = _answering_niceness(lambda priority, start: priority.started(start))
    if before + STEP > 19:
        pytest.skip(f"this run already runs at nice {before}: there is no lower priority to step down to")
    assert stepped == before + STEP
    assert answered == before


def test_a_server_the_stepped_down_thread_starts_itself_answers_at_the_lower_priority():
    """What the starter prevents: threads are born at their creator's priority."""
    before, stepped, answered = _answering_niceness(lambda priority, start: start())
    if before + STEP > 19:
        pytest.skip(f"this run already runs at nice {before}: there is no lower priority to step down to")
    assert answered == stepped == before + STEP


@pytest.mark.skipif(not os.environ.get(NICENESS_VARIABLE), reason=f"no {NICENESS_VARIABLE}: nothing stepped down")
def test_in_a_stepped_down_run_the_sessions_sandbox_serves_above_the_test_threads_priority(sandbox_server):
    port = sandbox_server.base_url.rsplit(":", 1)[1]
    [serving] = [t for t in threading.enumerate() if t.name == f"stripe-sandbox-{port}"]
    assert serving.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, serving.native_id) < thread_niceness()
