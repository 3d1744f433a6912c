"""The mailer over TLS (docs/REFERENCE.md, Settings: SMTP_URL, SMTP_CA_FILE): smtp+starttls:// and
smtps:// check the mail server's certificate and name, so the SMTP password and the order links go
to the server named and no one else; and without SMTP a message is a file only its owner reads.
The server is real (tests/smtp_support.py): a socket, SMTP, and a TLS handshake."""

from __future__ import annotations

import email
import email.utils
import os
import stat
from email.header import decode_header, make_header

import pytest

from shop import create_app
from shop.mailer import MailNotSent, _message, send
from smtp_support import SMTPServer, make_certificate


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("smtp-tls"))


@pytest.fixture(params=["smtp+starttls", "smtps"])
def tls_server(request, certificate):
    cert, key = certificate
    server = SMTPServer(cert, key, implicit_tls=request.param == "smtps")
    server.scheme = request.param
    yield server
    server.close()


def mail_app(tmp_path, **env):
    return create_app(env={"SECRET_KEY": "test-secret", "BACKSTOP_INSTANCE_PATH": str(tmp_path / "instance"), **env})


def test_a_server_whose_certificate_is_not_trusted_gets_neither_the_password_nor_the_message(tls_server, tmp_path):
    url = f"{tls_server.scheme}://shop:s3cret@127.0.0.1:{tls_server.port}"
    app = mail_app(tmp_path, SMTP_URL=url)
    with app.app_context(), pytest.raises(MailNotSent) as caught:
        send("bob@example.com", "Your order", "https://shop.example/orders/x", key="order-1-paid")
    words = str(caught.value)
    assert f"mail server 127.0.0.1:{tls_server.port} (SMTP_URL)" in words
    assert "certificate" in words and "SMTP_CA_FILE" in words and "s3cret" not in words
    assert tls_server.messages == [] and tls_server.logins == []
    assert tls_server.wait_for(lambda: tls_server.handshake_failures == 1)  # the client hung up in the handshake


def test_with_smtp_ca_file_naming_its_certificate_the_message_is_sent_over_tls(tls_server, certificate, tmp_path):
    cert, _ = certificate
    url = f"{tls_server.scheme}://shop:s3cret@127.0.0.1:{tls_server.port}"
    app = mail_app(tmp_path, SMTP_URL=url, SMTP_CA_FILE=str(cert))
    with app.app_context():
        assert send("bob@example.com", "Your order", "Paid, thank you.", key="order-1-paid") == "smtp:order-1-paid"
    [received] = tls_server.messages
    assert received.over_tls and received.rcpt_to == ["<bob@example.com>"]
    message = email.message_from_bytes(received.data)
    assert message["Subject"] == "Your order" and message["Message-ID"] == "<order-1-paid@backstop.invalid>"
    [(_, login_over_tls)] = tls_server.logins
    assert login_over_tls  # the password went only through the verified connection


def test_a_certificate_for_another_name_is_refused_even_when_its_ca_is_trusted(tmp_path):
    """Trusting the CA is not enough: the certificate must also name the server in SMTP_URL."""
    cert, key = make_certificate(tmp_path, names="DNS:mail.elsewhere.example")
    for scheme in ("smtp+starttls", "smtps"):
        server = SMTPServer(cert, key, implicit_tls=scheme == "smtps")
        try:
            app = mail_app(tmp_path, SMTP_URL=f"{scheme}://127.0.0.1:{server.port}", SMTP_CA_FILE=str(cert))
            with app.app_context(), pytest.raises(MailNotSent, match="could not be verified") as caught:
                send("bob@example.com", "Your order", "x", key="order-2-paid")
            assert "127.0.0.1" in str(caught.value) and server.messages == []
        finally:
            server.close()


def test_without_smtp_a_message_is_a_file_only_the_shops_user_reads(tmp_path):
    app = mail_app(tmp_path)
    old = os.umask(0o022)  # a usual umask: what the shop creates must not depend on it
    try:
        with app.app_context():
            path = send("bob@example.com", "Your order", "https://shop.example/orders/x", key="order-3-paid")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(app.instance_path).st_mode) == 0o700


def test_every_email_is_from_mail_from_and_carries_mail_reply_to_only_when_set(tmp_path):
    shop = mail_app(
        tmp_path, MAIL_FROM="Caf\u00e9 Shop <orders@shop.example>", MAIL_REPLY_TO="Help <help@shop.example>"
    )
    with shop.app_context():
        path = send("bob@example.com", "Your order", "Paid, thank you.", key="BK-TEST0001-order_paid-event")
    with open(path, "rb") as fh:
        message = email.message_from_binary_file(fh)
    # A name that is not ASCII travels encoded, and reads back as written.
    assert email.utils.parseaddr(str(make_header(decode_header(message["From"])))) == (
        "Caf\u00e9 Shop",
        "orders@shop.example",
    )
    assert email.utils.parseaddr(message["Reply-To"]) == ("Help", "help@shop.example")
    assert os.path.basename(path) == "BK-TEST0001-order_paid-event.eml"

    demo = mail_app(tmp_path / "demo")
    with demo.app_context():
        path = send("bob@example.com", "Your order", "Paid, thank you.", key="BK-TEST0002-order_paid-event")
    with open(path, "rb") as fh:
        message = email.message_from_binary_file(fh)
    assert message["From"] == "Backstop shop <shop@localhost>" and "Reply-To" not in message


def test_a_text_and_html_email_carries_its_boundary_before_it_is_flattened_and_no_part_can_hold_it(tmp_path):
    """The boundary is the mailer's (the generator would compile a regular expression per message
    to choose one); the parts are quoted-printable, so even text made of boundary lines reads back
    whole, in two parts."""
    trap = "--===============1234567890123456789==\n==== a = b ====\n"
    with mail_app(tmp_path).app_context():
        msg = _message("bob@example.com", "Your receipt", trap + "text", key="k", html=trap + "<p>html</p>")
        boundary = msg.get_boundary()
        parsed = email.message_from_bytes(msg.as_bytes())
    assert boundary is not None and boundary.startswith("=" * 15) and boundary.endswith("==")
    assert parsed.get_boundary() == boundary
    parts = [part.get_payload(decode=True).decode() for part in parsed.get_payload()]
    assert parts == [trap + "text", trap + "<p>html</p>"]
