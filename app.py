"""The WSGI entry point: `flask --app app ...` and `gunicorn app:app`."""

import sys

from shop import SettingsError, create_app

try:
    app = create_app()
except SettingsError as exc:
    # One clear line naming the variable, never a traceback (docs/REFERENCE.md, Settings).
    sys.stderr.write(f"backstop: configuration error: {exc}\n")
    # 4 is gunicorn's "App failed to load": its master then halts instead of respawning the
    # worker forever (any other code, e.g. 2, is treated as a worker crash and retried).
    raise SystemExit(4)
