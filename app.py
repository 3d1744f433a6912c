"""The WSGI entry point: `flask --app app ...` and `gunicorn app:app`."""

import sys

from shop import SettingsError, create_app


def _running_check(argv: list[str]) -> bool:
    """Is this process `flask ... shop check`? A bad setting stops every other command at once."""
    args = argv[1:]
    return any(a == "shop" and args[i + 1 : i + 2] == ["check"] for i, a in enumerate(args))


try:
    app = create_app()
except SettingsError as exc:
    if _running_check(sys.argv):
        # `flask shop check` reports it as its first check, in its own format, and exits 1.
        from shop.ops.preflight import render_json, render_text, settings_failed

        checks = settings_failed(exc)
        sys.stdout.write((render_json(checks) if "--json" in sys.argv else render_text(checks)) + "\n")
        raise SystemExit(1) from None
    # One clear line naming the variable, never a traceback (docs/REFERENCE.md, Settings).
    sys.stderr.write(f"backstop: configuration error: {exc}\n")
    # 4 is gunicorn's "App failed to load": its master then halts instead of respawning the
    # worker forever (any other code, e.g. 2, is treated as a worker crash and retried).
    raise SystemExit(4) from None
