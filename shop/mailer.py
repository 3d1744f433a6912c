"""The one way the shop sends email: SMTP when SMTP_URL is set (smtp://user:pass@host:port;
smtp+starttls:// upgrades the connection, smtps:// speaks TLS from the start, and both check the
server's certificate and name against the system's CAs or SMTP_CA_FILE), otherwise an .eml file
under instance/mail/ that a person can open (the folder 0700, the file 0600: order links)."""

from __future__ import annotations

import logging
import os
import secrets
import smtplib
import ssl
from email.charset import QP, Charset
from email.header import Header
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formataddr, parseaddr
from urllib.parse import urlparse

from flask import current_app

from .domain.deadlines import utcnow
from .settings import make_private_folder

log = logging.getLogger("shop.mailer")


class MailNotSent(Exception):
    pass


# Quoted-printable UTF-8: a person opening the file reads the text; any mail client decodes it.
_UTF8 = Charset("utf-8")
_UTF8.body_encoding = QP


def _header(value: str) -> str | Header:
    return value if value.isascii() else Header(value, "utf-8")


def _address(value: str) -> str:
    """A From or Reply-To as settings hold it (`Name <a@b>`), its name encoded when not ASCII."""
    return formataddr(parseaddr(value), "utf-8")


def _text_part(text: str, subtype: str) -> MIMEText:
    # MIMEText hands its charset to set_payload, which takes a Charset (ours: quoted-printable);
    # typeshed types the parameter as str only.
    return MIMEText(text, subtype, _UTF8)  # pyright: ignore[reportArgumentType]


def _boundary() -> str:
    """A multipart boundary of the email package's own shape (`===============<digits>==`), chosen
    here: left to the generator, it compiles a new regular expression per message to search the
    parts for it (a quarter of a receipt's flattening). No search is needed: every part is
    quoted-printable (_UTF8), where an "=" is always followed by two hex digits or ends a line, so
    no part can hold "==", let alone a line starting `--===`."""
    return "=" * 15 + f"{secrets.randbelow(10**19):019d}" + "=="


def _message(to: str, subject: str, body: str, key: str, html: str | None = None) -> MIMEText | MIMEMultipart:
    """The message, built with the email package's classic API: its modern one (EmailMessage)
    parses and refolds every header through its header registry, five times the CPU for the same
    bytes, paid on every order's emails (bench/compensation.py). With `html`, a
    multipart/alternative of the plain text first and the HTML last (the part a client prefers
    comes last, RFC 2046): a client that shows no HTML reads the same facts in the text."""
    if html is None:
        msg = _text_part(body, "plain")
    else:
        msg = MIMEMultipart("alternative", boundary=_boundary())
        msg.attach(_text_part(body, "plain"))
        msg.attach(_text_part(html, "html"))
    # A compat32 message takes a Header as a header's value (the email.header docs); typeshed's
    # default Message[str, str] admits only str.
    cfg = current_app.config
    msg["From"], msg["To"], msg["Subject"] = _address(cfg["MAIL_FROM"]), _header(to), _header(subject)  # pyright: ignore[reportArgumentType]
    if cfg.get("MAIL_REPLY_TO"):
        msg["Reply-To"] = _address(cfg["MAIL_REPLY_TO"])
    msg["Date"] = utcnow().strftime("%a, %d %b %Y %H:%M:%S +0000")
    msg["Message-ID"] = f"<{key}@backstop.invalid>"
    return msg


def _tls_context() -> ssl.SSLContext:
    """Certificate and host name checked (Python's smtplib checks neither without a context):
    against SMTP_CA_FILE when set, else the system's CAs."""
    return ssl.create_default_context(cafile=current_app.config.get("SMTP_CA_FILE") or None)


def _connect(scheme: str, host: str, port: int | None) -> smtplib.SMTP:
    if scheme == "smtps":
        return smtplib.SMTP_SSL(host, port or 465, timeout=10, context=_tls_context())
    smtp = smtplib.SMTP(host, port or 25, timeout=10)
    if scheme == "smtp+starttls":
        try:
            smtp.starttls(context=_tls_context())
        except BaseException:
            smtp.close()
            raise
    return smtp


def _by_smtp(url: str, msg: MIMEText | MIMEMultipart) -> None:
    parts = urlparse(url)
    default_port = 465 if parts.scheme == "smtps" else 25
    server = f"{parts.hostname}:{parts.port or default_port}"
    try:
        with _connect(parts.scheme, parts.hostname or "", parts.port) as smtp:
            if parts.username:
                smtp.login(parts.username, parts.password or "")
            smtp.send_message(msg)
    except ssl.SSLCertVerificationError as exc:
        # Nothing was sent, the password neither: the server could not prove it is the one named.
        raise MailNotSent(
            f"the mail server {server} (SMTP_URL) presented a certificate that could not be verified "
            f"({exc.verify_message or exc}); nothing was sent. If it is signed by a private CA, set "
            "SMTP_CA_FILE to that CA's PEM file"
        ) from exc
    except (OSError, smtplib.SMTPException) as exc:
        # What an operator reading the dead letter needs: which server, and where it is set.
        raise MailNotSent(
            f"the mail server {server} (SMTP_URL) did not take the message: {type(exc).__name__}: {exc}"
        ) from exc


def send(to: str, subject: str, body: str, *, key: str, html: str | None = None) -> str:
    """`key` names the message (e.g. "order-12-paid"); the file outbox uses it as the file name,
    so a retried send overwrites instead of duplicating. `html`: the same email as HTML, sent
    with the text as multipart/alternative."""
    msg = _message(to, subject, body, key, html)
    url = current_app.config.get("SMTP_URL")
    if url:
        _by_smtp(url, msg)
        log.info("mail %s sent to %s via SMTP", key, to)
        return f"smtp:{key}"
    # The messages carry the customers' order links: readable by the shop's user only.
    folder = os.path.join(current_app.instance_path, "mail")
    make_private_folder(folder)
    path = os.path.join(folder, f"{key}.eml")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a .tmp left by a crash keeps its old mode otherwise
    with os.fdopen(fd, "wb") as fh:
        fh.write(msg.as_bytes())
    os.replace(tmp, path)
    log.info("mail %s to %s written to %s", key, to, path)
    return path
