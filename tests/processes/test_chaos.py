"""The whole stack under fire, in CI: `bench/chaos.py --smoke` starts the real processes (gunicorn,
two workers, the scheduler, the sandbox) on a fresh PostgreSQL database with a Redis of its own,
drives customers through every kind of journey while it kills workers and the scheduler, wipes
Redis, terminates database connections and breaks webhooks and the provider, then checks the
guarantees from the outside. Its exit status is the verdict; its summary is the failure message."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import REPO_ROOT

ROOT = str(REPO_ROOT)
DATABASE_URL = os.environ.get("DATABASE_URL", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(
        not DATABASE_URL.startswith("postgres"),
        reason="the chaos run needs PostgreSQL (pg_terminate_backend, concurrent workers)",
    ),
]


def test_the_smoke_chaos_run_keeps_every_guarantee():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "chaos.py"), "--smoke", "--database-url", DATABASE_URL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-3000:]
