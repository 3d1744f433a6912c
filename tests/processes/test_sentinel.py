"""Redis behind Sentinel (docs/REFERENCE.md, Settings: REDIS_URL `redis+sentinel://`): a master, a
replica and three Sentinels started by the test with the `redis-server` binary, the web in this
process and a real worker and scheduler all finding the master through the Sentinels. The master
is SIGKILLed while customers check out: the replica is promoted, every process follows it without
a restart, and nothing is lost: every order's deadline still cancels it and gives its stock back,
those whose scheduling was only in the writes the dead master took with it included."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest
from redis import Redis
from rq import Worker
from rq.job import JobStatus

from factories import on_hand, seed_catalog_rows, variant_id
from payment_helpers import Shopper
from process_support import Processes, free_port, process_env
from shop import queue
from shop.devserver.bundled_redis import redis_server_command
from shop.extensions import db
from shop.models import InventoryItem, Order, OutboxDelivery, ScheduledCommand
from support import UNREACHABLE_PROVIDER, wait_until

pytestmark = pytest.mark.slow

REDIS_SERVER = shutil.which("redis-server")
SERVICE = "backstop"
WINDOW = 3


class SentinelSet:
    """A master, a replica and three Sentinels watching them, each its own redis-server."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="backstop-sentinel-")
        self.master_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        self._run("master", redis_server_command(REDIS_SERVER, self.master_port, self.folder))
        self._run(
            "replica",
            [
                *redis_server_command(REDIS_SERVER, self.replica_port, self.folder),
                *("--replicaof", "127.0.0.1", str(self.master_port)),
            ],
        )
        for i, port in enumerate(self.sentinel_ports):
            conf = os.path.join(self.folder, f"sentinel-{i}.conf")
            with open(conf, "w") as f:
                f.write(
                    f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                    f"sentinel failover-timeout {SERVICE} 10000\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
            self._run(f"sentinel-{i}", [REDIS_SERVER, conf, "--sentinel"])
        wait_until(self._watching, 30, "three Sentinels that see the master, its replica and each other", self.logs)

    def _run(self, name: str, args: list[str]) -> None:
        out = open(os.path.join(self.folder, f"{name}.log"), "wb")
        self.procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def sentinel(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port, socket_timeout=1, decode_responses=True)

    def _watching(self) -> bool:
        try:
            for port in self.sentinel_ports:
                with self.sentinel(port) as s:
                    info = s.sentinel_master(SERVICE)
                    if int(info["num-slaves"]) < 1 or int(info["num-other-sentinels"]) < 2:
                        return False
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def master_port_now(self) -> int | None:
        try:
            with self.sentinel(self.sentinel_ports[0]) as s:
                return int(s.sentinel_get_master_addr_by_name(SERVICE)[1])
        except Exception:  # noqa: BLE001 - the Sentinel is busy with the failover
            return None

    def kill_master(self) -> None:
        self.procs["master"].send_signal(signal.SIGKILL)
        self.procs["master"].wait(timeout=5)

    def logs(self) -> str:
        parts = []
        for name in self.procs:
            with open(os.path.join(self.folder, f"{name}.log"), errors="replace") as f:
                parts.append(f"--- {name} ---\n{f.read()[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def sentinels():
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian's package redis-server)")
    found = SentinelSet()
    try:
        found.start()
        yield found
    finally:
        found.stop()


def _settled(app, references: list[str]) -> bool:
    return not _unsettled(app, references)


def _unsettled(app, references: list[str]) -> list[str]:
    """Each order not yet cancelled with its stock back, with its state and its deadline's."""
    with app.app_context():
        rows = {o.reference: o for o in db.session.query(Order).filter(Order.reference.in_(references)).all()}
        out = []
        for ref in references:
            order = rows.get(ref)
            if order is None:
                out.append(f"{ref}: not in the database")
            elif not (order.status == "Cancelled" and order.inventory_restored):
                commands = db.session.query(ScheduledCommand).filter(ScheduledCommand.order_id == order.id).all()
                deliveries = db.session.query(OutboxDelivery).filter(OutboxDelivery.order_id == order.id).all()
                out.append(
                    f"{ref}: {order.status}, restored {order.inventory_restored}; commands "
                    + ", ".join(f"{c.kind} {c.status} due {c.next_attempt_at} tries {c.attempts}" for c in commands)
                    + "; deliveries "
                    + ", ".join(f"{d.handler} {d.status} tries {d.attempts}" for d in deliveries)
                )
        db.session.remove()
    return out


def test_a_killed_master_is_followed_by_every_process_and_no_order_is_lost(make_fresh_app, sentinels):
    app = make_fresh_app(
        REDIS_URL=sentinels.url,
        STRIPE_API_BASE=UNREACHABLE_PROVIDER,
        UNPAID_ORDER_EXPIRY_SECONDS=WINDOW,
        RECONCILIATION_STUCK_AGE_SECONDS=WINDOW,
        UNPAID_ORDERS_PER_CLIENT=1000,  # one browser is the whole load: the hoarding limit is not under test
    )
    shopper = Shopper(app, seed_catalog_rows(app))
    with app.app_context():
        db.session.get(InventoryItem, variant_id("NB-A5-DOT")).on_hand = stock = 1000  # enough for the load
        db.session.commit()
        assert queue.redis_conn().connection_pool.get_master_address()[1] == sentinels.master_port
        db.session.remove()

    placed, placed_at, failures, stop = [], [], [], threading.Event()

    def customers():  # a checkout every 0.2 s, before, during and after the failover
        while not stop.is_set():
            r = shopper.checkout(email="load@example.com")
            if r.status_code == 303:
                placed.append(r.headers["Location"].split("/orders/")[1].split("?")[0])
                placed_at.append(time.monotonic())
            else:
                failures.append(r.status_code)
            time.sleep(0.2)

    procs = Processes()
    try:
        env = process_env(app, window=WINDOW)
        procs.start("worker", ["shop", "worker"], env)
        procs.start("scheduler", ["shop", "scheduler"], env)

        def both_running() -> bool:  # the worker registered with RQ, the scheduler polling
            with app.app_context():
                return bool(Worker.all(queue=queue.work_queue())) and "scheduler polling" in procs.logs()

        wait_until(both_running, 30, "the worker and the scheduler", procs.logs)
        load = threading.Thread(target=customers, daemon=True)
        load.start()
        wait_until(lambda: len(placed) >= 5, 30, "checkouts placed before the failover", procs.logs)

        sentinels.kill_master()
        killed = time.monotonic()
        wait_until(
            lambda: sentinels.master_port_now() == sentinels.replica_port,
            30,
            "the replica's promotion",
            sentinels.logs,
        )
        promoted = time.monotonic()

        def this_process_follows() -> bool:
            with app.app_context():
                try:
                    return queue.redis_conn().ping() and queue.redis_conn().connection_pool.get_master_address()[1] == (
                        sentinels.replica_port
                    )
                except Exception:  # noqa: BLE001 - still on the dead master
                    return False

        wait_until(this_process_follows, 15, "the web's Redis client to follow the promotion", procs.logs)
        # Checkouts go on after the promotion: a few through the new master (however slowly this
        # machine serves them), not a count reached in a fixed time.
        wait_until(lambda: sum(t > promoted for t in placed_at) >= 3, 15, "checkouts after the promotion", procs.logs)
        stop.set()
        load.join(timeout=10)
        after = [ref for ref in placed]  # every order, from before the kill to after the promotion
        wait_until(
            lambda: _settled(app, after),
            60,
            f"every order's deadline to cancel it and give its stock back ({len(after)} orders)",
            lambda: "\n".join(_unsettled(app, after)) + "\n" + procs.logs() + sentinels.logs(),
        )
    finally:
        stop.set()
        procs.stop()

    assert failures == []
    assert any(t < killed for t in placed_at) and sum(t > promoted for t in placed_at) >= 3
    assert promoted - killed < 30
    assert on_hand("NB-A5-DOT", app) == stock


def test_a_worker_whose_master_fails_over_during_its_start_follows_the_new_master_and_works(
    make_fresh_app, sentinels, tmp_path
):
    """The worker is held at its start once its birth record is in Redis and on the replica (a
    failpoint, no clock); the master dies and the replica, which has that record, is promoted; the
    worker goes on. Whether its next step follows the promotion at once or fails and starts again
    (under its own name, whose record the new master already holds: the empty-or-kept cases of
    tests/processes/test_processes.py pin that path), it must listen on the new master and run a
    job."""
    app = make_fresh_app(REDIS_URL=sentinels.url, STRIPE_API_BASE=UNREACHABLE_PROVIDER)
    hold = str(tmp_path / "hold")
    replica = Redis(host="127.0.0.1", port=sentinels.replica_port)
    procs = Processes()
    try:
        env = process_env(app, window=WINDOW, BACKSTOP_FAILPOINTS=f"worker.start.subscribe=hold:{hold}")
        worker = procs.start("worker", ["shop", "worker"], env)
        wait_until(lambda: os.path.exists(hold + ".held"), 60, "the worker to register its birth", procs.logs)
        wait_until(lambda: replica.smembers("rq:workers"), 15, "the birth record on the replica", sentinels.logs)
        sentinels.kill_master()
        wait_until(lambda: sentinels.master_port_now() == sentinels.replica_port, 30, "the promotion", sentinels.logs)
        open(hold, "w").close()  # the worker goes on, into the dead master
        wait_until(
            lambda: any(replica.hget(key, "state") == b"idle" for key in replica.smembers("rq:workers")),
            60,
            "the worker to register and listen on the new master",
            lambda: procs.logs() + sentinels.logs(),
        )
        with app.app_context():
            job = queue.work_queue().enqueue("shop.jobs.relay")
        wait_until(
            lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, "the worker to run a job", procs.logs
        )
        assert worker.poll() is None, procs.logs()
    finally:
        procs.stop()
