"""`python -m shop.stripe_sandbox [--host H] [--port P] [--min-session-seconds N]`."""

import argparse

from .server import DEFAULT_HOST, DEFAULT_PORT, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m shop.stripe_sandbox", description=__doc__)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--min-session-seconds", type=int, default=1800)
    args = parser.parse_args()
    run(args.host, args.port, args.min_session_seconds)


if __name__ == "__main__":
    main()
