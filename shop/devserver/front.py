"""The web's front: nginx on the public port, reading every request whole before gunicorn's
threads see it (README, Production; deploy/nginx.conf says why).

`flask shop web` (the Procfile's web line) runs `serve`: gunicorn on a loopback socket, nginx on
$PORT in front of it, both supervised; when either dies the other is stopped and the command
exits, and SIGTERM/SIGINT/SIGHUP stop both (nginx first, gracefully, so the requests it holds
still reach gunicorn). `flask shop up` starts the same two through its own supervisor with
`Front` and `gunicorn_argv`.

Without nginx, `flask shop web` refuses in one line (a production web that any slow client can
stop should not start quietly); `WEB_FRONT=none` runs gunicorn alone on $PORT, as a deliberate
choice (a platform that buffers requests itself), with a warning. `flask shop up` is a demo on
127.0.0.1 and falls back to gunicorn alone, saying so (see steps.start_processes).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..settings_values import TrustedProxies

# Where nginx is looked for when it is not on PATH (Debian's package puts it in /usr/sbin, which
# is not on an ordinary user's PATH).
NGINX_PLACES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
TEMPLATE_NAME = os.path.join("deploy", "nginx.conf")
FIELDS = ("run", "user", "listen", "upstream", "client", "connections")
# nginx holds two descriptors per client it proxies (the client's and gunicorn's).
WANTED_OPEN_FILES = 10_000
# nginx's worker_connections: at most this many, and fewer when the open-file limit is lower
# (worker_connections); its own other descriptors (listening sockets, logs, temporary files)
# take at most SPARE_FILES.
MOST_CONNECTIONS = 4096
SPARE_FILES = 32
LEAST_CONNECTIONS = 64
LOOPBACK = "127.0.0.1"
NGINX_STOP_GRACE = 10.0  # seconds nginx may take to finish the requests it holds, after SIGQUIT
GUNICORN_STOP_GRACE = 35.0  # gunicorn's own graceful timeout is 30 s
NOBODY = TrustedProxies()  # TRUSTED_PROXIES unset: only the connecting address counts


class FrontError(Exception):
    """Why the front cannot start, in one line."""


def nginx_binary(env=None) -> str | None:
    """BACKSTOP_NGINX when set (None when that is no executable), else nginx on PATH, else the
    usual places."""
    given = ((os.environ if env is None else env).get("BACKSTOP_NGINX") or "").strip()
    if given:
        return given if os.access(given, os.X_OK) and os.path.isfile(given) else None
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_PLACES if os.access(p, os.X_OK)), None)


NO_NGINX = "nginx is not installed (Debian: apt-get install nginx-light; Heroku: the nginx buildpack)"


def no_nginx_words(env=None) -> str:
    given = ((os.environ if env is None else env).get("BACKSTOP_NGINX") or "").strip()
    return f"BACKSTOP_NGINX={given} is not an executable file" if given else NO_NGINX


def template_path() -> str:
    """deploy/nginx.conf of this checkout (next to the `shop` package), else of the current folder."""
    here = Path(__file__).resolve().parent.parent.parent / TEMPLATE_NAME
    if here.exists():
        return str(here)
    return os.path.join(os.getcwd(), TEMPLATE_NAME)


def render(template: str, **values: str) -> str:
    """The template with every {{field}} filled in; a field missing either way is a mistake."""
    text = template
    for name in FIELDS:
        marker = "{{" + name + "}}"
        if marker not in text and name != "user":
            raise FrontError(f"{TEMPLATE_NAME} has no {marker}")
        text = text.replace(marker, values[name])
    if "{{" in text:
        left = text[text.index("{{") : text.index("{{") + 30].split()[0]
        raise FrontError(f"{TEMPLATE_NAME}: unknown field {left}")
    return text


def client_directives(trust: TrustedProxies) -> str:
    """nginx's reading of TRUSTED_PROXIES (shop.web.proxies has the app's): `$backstop_client`,
    the client every per-address limit of the front counts and the X-Forwarded-For it hands
    gunicorn. Nothing trusted: the connecting address. Networks: nginx's realip walk, the app's
    own rule. A hop count: the entry that many from the end (werkzeug's ProxyFix), the
    connecting address when the header has fewer."""
    lines = []
    if trust.networks:
        lines += [f"set_real_ip_from {network};" for network in trust.networks]
        lines += ["real_ip_header X-Forwarded-For;", "real_ip_recursive on;"]
    if trust.hops:
        pattern = r"(?:^|,)\s*([^,\s]+)\s*" + r"(?:,\s*[^,\s]+\s*){%d}$" % (trust.hops - 1)
        lines.append(f'map $http_x_forwarded_for $backstop_client {{ "~{pattern}" $1; default $remote_addr; }}')
    else:
        lines.append("map $remote_addr $backstop_client { default $remote_addr; }")
    return "\n  ".join(lines)


@dataclass
class Front:
    """nginx listening on `listen` (host:port) for `upstream` (host:port), its configuration,
    pid and temporary files in a private folder made for it (`run_dir`), removed by `cleanup`."""

    binary: str
    listen: str
    upstream: str
    run_dir: str

    @classmethod
    def prepare(cls, binary: str, listen: str, upstream: str, trust: TrustedProxies = NOBODY) -> Front:
        try:
            with open(template_path(), encoding="utf-8") as f:
                template = f.read()
        except OSError as exc:
            raise FrontError(f"cannot read the front's configuration {template_path()}: {exc.strerror}") from None
        run_dir = tempfile.mkdtemp(prefix="backstop-front-")
        os.mkdir(os.path.join(run_dir, "tmp"), 0o700)
        user = ""
        if os.geteuid() == 0:
            # nginx started by root runs its workers as another user (nobody by default): they
            # must reach the temporary folders, which nginx creates and hands to that user.
            import grp
            import pwd

            nobody = pwd.getpwnam("nobody")
            user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};"
            os.chmod(run_dir, 0o711)
            os.chmod(os.path.join(run_dir, "tmp"), 0o711)
        conf = render(
            template,
            run=run_dir,
            user=user,
            listen=listen,
            upstream=upstream,
            client=client_directives(trust),
            connections=str(worker_connections(open_files_for_nginx())),
        )
        with open(os.path.join(run_dir, "nginx.conf"), "w", encoding="utf-8") as f:
            f.write(conf)
        return cls(binary, listen, upstream, run_dir)

    @property
    def argv(self) -> list[str]:
        # -e stderr: nginx opens its compiled-in error log (/var/log/nginx) before it reads the
        # configuration, which an ordinary user may not write.
        return [self.binary, "-p", self.run_dir, "-e", "stderr", "-c", os.path.join(self.run_dir, "nginx.conf")]

    def cleanup(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def open_files_for_nginx() -> int:
    """The open-file limit nginx will run with: this process's, raised by raise_open_file_limit."""
    try:
        import resource
    except ImportError:
        return WANTED_OPEN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    raised = WANTED_OPEN_FILES if hard == infinite else min(WANTED_OPEN_FILES, hard)
    return raised if soft == infinite else max(soft, raised)


def worker_connections(open_files: int) -> int:
    """nginx's worker_connections for this open-file limit. When its connections run out, nginx
    closes the idle ones (connected and silent, or kept alive between requests) to make room, so
    a client holding thousands of them crowds out no one; but when the open-file limit comes
    first, nginx can only stop accepting, and every client waited behind the idle ones (health
    probes took 25 s). So there are never more connections than files for them."""
    connections = min(MOST_CONNECTIONS, open_files - SPARE_FILES)
    if connections < LEAST_CONNECTIONS:
        raise FrontError(
            f"the open-file limit ({open_files}) leaves nginx fewer than {LEAST_CONNECTIONS} connections; "
            "raise it (ulimit -n)"
        )
    return connections


def raise_open_file_limit() -> None:
    """As many open files as nginx's connections need, up to what this user may have."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(WANTED_OPEN_FILES, hard)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError):
        pass


def gunicorn_argv(bind: str, workers: int | str, threads: int | str, *extra: str) -> list[str]:
    """gunicorn's threaded workers, as the Procfile's web line always ran them."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "app:app",
        "--bind",
        bind,
        "--worker-class",
        "gthread",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        *extra,
    ]


def loopback_listener() -> socket.socket:
    """A listening socket on a free loopback port, handed to gunicorn (`--bind fd://N`): no
    other process can take the port between choosing it and binding it, and connections
    queue in it from the start."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(2048)
    return sock


def _child_setup():
    """In each child: SIGTERM when this supervisor dies (Linux), and nginx's open file limit."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def hook():
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        raise_open_file_limit()

    return hook


def say(text: str) -> None:
    sys.stderr.write(f"backstop web: {text}\n")
    sys.stderr.flush()


def given_server(server: list[str], bind: str) -> list[str]:
    """The server command the Procfile's web line names (`flask shop web -- gunicorn app:app
    --worker-class gthread ...`), bound to `bind`; `gunicorn` runs as this Python's module, so
    the line works whether or not the virtualenv's bin is on PATH."""
    if any(arg == "--bind" or arg.startswith(("--bind=", "-b")) for arg in server):
        raise FrontError("the server command after `--` must not bind itself: `flask shop web` binds it")
    head = [sys.executable, "-m", "gunicorn"] if server[0] == "gunicorn" else server[:1]
    return [*head, *server[1:], "--bind", bind]


def serve(
    host: str,
    port: int,
    workers: int,
    threads: int,
    front: str,
    server: list[str] | None = None,
    trust: TrustedProxies = NOBODY,
) -> int:
    """`flask shop web`: returns the exit code (see the module's docstring)."""
    public = f"{host}:{port}"

    def server_argv(bind: str) -> list[str]:
        return given_server(server, bind) if server else gunicorn_argv(bind, workers, threads)

    try:
        server_argv(public)
    except FrontError as exc:
        say(str(exc))
        return 3
    if front == "none":
        say(
            f"WARNING: WEB_FRONT=none: gunicorn serves {public} itself, with no front to buffer "
            "requests; a slow or idle client holds one of its threads until it finishes"
        )
        argv = server_argv(public)
        os.execv(argv[0], argv)
    binary = nginx_binary()
    if binary is None:
        say(f"{no_nginx_words()}; refusing to serve without it (WEB_FRONT=none runs gunicorn alone)")
        return 3

    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = stop["signal"] or signum

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    listener = loopback_listener()
    inner = f"{LOOPBACK}:{listener.getsockname()[1]}"
    try:
        web = Front.prepare(binary, public, inner, trust)
    except FrontError as exc:
        listener.close()
        say(str(exc))
        return 3
    return _serve_behind(web, listener, server_argv, stop)


def _serve_behind(web, listener, server_argv, stop: dict) -> int:
    """gunicorn on the loopback listener, nginx before it on the public address: until a signal
    (0) or either child exits (its code, or 1); both stopped on the way out."""
    public, inner = web.listen, web.upstream
    children: list[tuple[str, subprocess.Popen]] = []
    try:
        env = {**os.environ, "BACKSTOP_BEHIND_FRONT": "1"}
        gunicorn = subprocess.Popen(
            server_argv(f"fd://{listener.fileno()}"),
            env=env,
            pass_fds=(listener.fileno(),),
            preexec_fn=_child_setup(),
        )
        children.append(("gunicorn", gunicorn))
        listener.close()
        nginx = subprocess.Popen(web.argv, stdin=subprocess.DEVNULL, preexec_fn=_child_setup())
        children.append(("nginx", nginx))
        say(f"nginx on {public} reads each request whole, then hands it to gunicorn on {inner}")
        while stop["signal"] is None:
            for name, child in children:
                if child.poll() is not None:
                    say(f"{name} exited (code {child.returncode}); stopping the other")
                    return child.returncode or 1
            time.sleep(0.2)
        say(f"{signal.Signals(stop['signal']).name} received; stopping nginx, then gunicorn")
        return 0
    finally:
        _stop(children)
        web.cleanup()


def _stop(children: list[tuple[str, subprocess.Popen]]) -> None:
    """nginx first and gracefully (SIGQUIT: it finishes the requests it holds, which still need
    gunicorn), then gunicorn (SIGTERM: its workers finish theirs); SIGKILL after their grace."""
    order = sorted(children, key=lambda c: c[0] != "nginx")
    for name, child in order:
        if child.poll() is not None:
            continue
        child.send_signal(signal.SIGQUIT if name == "nginx" else signal.SIGTERM)
        try:
            child.wait(timeout=NGINX_STOP_GRACE if name == "nginx" else GUNICORN_STOP_GRACE)
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in time; killing it")
            child.kill()
            child.wait()
