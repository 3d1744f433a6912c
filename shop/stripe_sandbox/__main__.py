"""`python -m shop.stripe_sandbox [--host H] [--port P] [--fd N] [--min-session-seconds N] [--state-file PATH]`."""

import argparse

from .server import DEFAULT_HOST, DEFAULT_PORT, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m shop.stripe_sandbox", description=__doc__)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--fd",
        type=int,
        default=None,
        help="serve on this already bound, listening socket (what `flask shop up` hands it)",
    )
    parser.add_argument("--min-session-seconds", type=int, default=1800)
    parser.add_argument(
        "--state-file", default=None, help="keep sessions, events and endpoints in this file across restarts"
    )
    args = parser.parse_args()
    run(args.host, args.port, args.min_session_seconds, args.state_file, fd=args.fd)


if __name__ == "__main__":
    main()
