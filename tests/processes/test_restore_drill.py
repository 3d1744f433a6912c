"""The chaos run and the restore drill, in CI: `bench/chaos.py --smoke --restore-drill` starts the
real processes (gunicorn, two workers, the scheduler, the sandbox) on a fresh PostgreSQL database
with a Redis of its own and drives customers through every kind of journey while it kills workers
and the scheduler, wipes Redis, terminates database connections and breaks webhooks and the
provider (the smoke chaos run; the drill adds its restore to it rather than running it twice). It
copies the database with pg_dump while one checkout waits on a slow provider, lets the shop go on
(that order's customer pays on the page the old shop made; others are placed, paid, cancelled and
refunded), stops it, restores the copy into a fresh database with pg_restore, starts every process
on the copy with an empty Redis, sends customers to it, and checks every guarantee of the chaos run
on the copy: deadlines re-armed, deliveries relayed, the sweep running, stock conserved, and every
payment the provider took either the payment of its order or refunded once, including those the
copy never heard of (docs/REFERENCE.md, Guarantees). Its exit status is the verdict; its summary is
the failure message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support import REPO_ROOT

ROOT = str(REPO_ROOT)
DATABASE_URL = os.environ.get("DATABASE_URL", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(not DATABASE_URL.startswith("postgres"), reason="the drill copies a PostgreSQL database"),
    pytest.mark.skipif(
        not (shutil.which("pg_dump") and shutil.which("pg_restore")),
        reason="pg_dump and pg_restore (PostgreSQL's client tools) are missing",
    ),
]


def test_under_faults_and_after_a_restore_from_a_copy_taken_under_load_every_guarantee_holds():
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "chaos.py"),
            "--smoke",
            "--restore-drill",
            "--database-url",
            DATABASE_URL,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-3000:]
    assert "restore drill: the copy had the waiting order without its payment page" in done.stdout
