"""A real, minimal SMTP server for the mailer's TLS tests: a thread on a listening socket that
speaks just enough SMTP (greeting, EHLO advertising STARTTLS, STARTTLS or implicit TLS, AUTH
PLAIN, MAIL/RCPT/DATA/QUIT) with a certificate made by the `openssl` binary, and records what it
received. Not a mock: the mailer's smtplib talks to it over a socket and does the TLS handshake."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lane_priority import start_thread
from support import wait_until


def make_certificate(folder: Path, names: str = "DNS:localhost,IP:127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for `names` (subjectAltName), valid one day: (cert.pem, key.pem)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl binary is needed to make the test server's certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", f"subjectAltName={names}", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@dataclass
class Received:
    mail_from: str
    rcpt_to: list[str]
    data: bytes
    over_tls: bool


@dataclass
class SMTPServer:
    """`implicit_tls`: TLS from the first byte (smtps://); else plain with STARTTLS offered."""

    cert: Path
    key: Path
    implicit_tls: bool = False
    messages: list[Received] = field(default_factory=list)
    logins: list[tuple[bytes, bool]] = field(default_factory=list)  # (the AUTH line, over TLS)
    handshake_failures: int = 0

    def __post_init__(self):
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(str(self.cert), str(self.key))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = start_thread(self._serve)

    def wait_for(self, condition, timeout: float = 5.0) -> bool:
        """The server notices a client's hang-up a moment after the client has moved on."""
        return bool(wait_until(condition, timeout, "the server to notice the client's hang-up", interval=0.01))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            conn.settimeout(10)
            self._upgraded = []
            try:
                self._session(conn)
            except ssl.SSLError:
                self.handshake_failures += 1  # the client refused the certificate: nothing more comes
            except OSError:
                pass
            finally:
                for upgraded in self._upgraded:
                    upgraded.close()
                conn.close()

    def _upgrade(self, conn: socket.socket) -> socket.socket:
        return self._tls.wrap_socket(conn, server_side=True)

    def _session(self, conn: socket.socket) -> None:
        tls = self.implicit_tls
        if tls:
            conn = self._upgrade(conn)
            self._upgraded.append(conn)
        reader = conn.makefile("rb")
        conn.sendall(b"220 localhost test ESMTP\r\n")
        mail_from, rcpt_to = "", []
        while True:
            line = reader.readline()
            if not line:
                return
            verb = line.split(b" ", 1)[0].strip().upper()
            if verb in (b"EHLO", b"HELO"):
                offers = [b"localhost"] + ([b"AUTH PLAIN"] if tls else [b"STARTTLS"])
                conn.sendall(b"".join(b"250-" + o + b"\r\n" for o in offers[:-1]) + b"250 " + offers[-1] + b"\r\n")
            elif verb == b"STARTTLS" and not tls:
                conn.sendall(b"220 go ahead\r\n")
                conn, tls = self._upgrade(conn), True
                self._upgraded.append(conn)  # closed by _serve with the connection it wraps
                reader = conn.makefile("rb")
            elif verb == b"AUTH":
                self.logins.append((line.strip(), tls))
                conn.sendall(b"235 ok\r\n")
            elif verb == b"MAIL":
                mail_from, rcpt_to = line.decode().split(":", 1)[1].strip(), []
                conn.sendall(b"250 ok\r\n")
            elif verb == b"RCPT":
                rcpt_to.append(line.decode().split(":", 1)[1].strip())
                conn.sendall(b"250 ok\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 end with .\r\n")
                data = b""
                while (chunk := reader.readline()) not in (b".\r\n", b""):
                    data += chunk
                self.messages.append(Received(mail_from, rcpt_to, data, tls))
                conn.sendall(b"250 queued\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:  # RSET, NOOP, anything else
                conn.sendall(b"250 ok\r\n")
