"""Named failpoints for crash tests: `BACKSTOP_FAILPOINTS=name=kill`, `name=sleep:2` or
`name=hold:/some/path`.

Off unless the environment variable is set. A test uses it to SIGKILL a real worker process at
an exact point (e.g. after the restore marker is flushed, before the commit) and then checks
that nothing half-done survived. `hold:PATH` stops the process at the point, without a clock:
it creates `PATH.held` on arrival and goes on once `PATH` exists, so a test can change the world
(take Redis away) at exactly that moment and then let the process meet it.
"""

import os
import signal
import time


def hit(name: str) -> None:
    spec = os.environ.get("BACKSTOP_FAILPOINTS")
    if not spec:
        return
    for item in spec.split(","):
        point, _, action = item.partition("=")
        if point.strip() != name:
            continue
        action = action.strip()
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        elif action.startswith("hold:"):
            _hold(action.split(":", 1)[1])
        elif action == "raise":
            raise RuntimeError(f"failpoint {name}")


def _hold(path: str) -> None:
    with open(path + ".held", "w"):
        pass
    while not os.path.exists(path):
        time.sleep(0.05)
