"""The one way the shop sends email: SMTP when SMTP_URL is set (smtp://user:pass@host:port),
otherwise an .eml file under instance/mail/ that a person can open."""

from __future__ import annotations

import logging
import os
import smtplib
from email.charset import QP, Charset
from email.header import Header
from email.mime.text import MIMEText
from urllib.parse import urlparse

from flask import current_app

from .domain.deadlines import utcnow

log = logging.getLogger("shop.mailer")
SENDER = "Backstop shop <shop@backstop.invalid>"


class MailNotSent(Exception):
    pass


# Quoted-printable UTF-8: a person opening the file reads the text; any mail client decodes it.
_UTF8 = Charset("utf-8")
_UTF8.body_encoding = QP


def _header(value: str) -> str | Header:
    return value if value.isascii() else Header(value, "utf-8")


def _message(to: str, subject: str, body: str, key: str) -> MIMEText:
    """The message, built with the email package's classic API: its modern one (EmailMessage)
    parses and refolds every header through its header registry, five times the CPU for the same
    bytes, paid on every order's emails (bench/compensation.py)."""
    msg = MIMEText(body, "plain", _UTF8)
    msg["From"], msg["To"], msg["Subject"] = SENDER, _header(to), _header(subject)
    msg["Date"] = utcnow().strftime("%a, %d %b %Y %H:%M:%S +0000")
    msg["Message-ID"] = f"<{key}@backstop.invalid>"
    return msg


def send(to: str, subject: str, body: str, *, key: str) -> str:
    """`key` names the message (e.g. "order-12-paid"); the file outbox uses it as the file name,
    so a retried send overwrites instead of duplicating."""
    msg = _message(to, subject, body, key)
    url = current_app.config.get("SMTP_URL")
    if url:
        parts = urlparse(url)
        server = f"{parts.hostname}:{parts.port or 25}"
        try:
            with smtplib.SMTP(parts.hostname, parts.port or 25, timeout=10) as smtp:
                if parts.scheme == "smtp+starttls":
                    smtp.starttls()
                if parts.username:
                    smtp.login(parts.username, parts.password or "")
                smtp.send_message(msg)
        except (OSError, smtplib.SMTPException) as exc:
            # What an operator reading the dead letter needs: which server, and where it is set.
            raise MailNotSent(
                f"the mail server {server} (SMTP_URL) did not take the message: {type(exc).__name__}: {exc}"
            ) from exc
        log.info("mail %s sent to %s via SMTP", key, to)
        return f"smtp:{key}"
    folder = os.path.join(current_app.instance_path, "mail")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{key}.eml")
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(msg.as_bytes())
    os.replace(tmp, path)
    log.info("mail %s to %s written to %s", key, to, path)
    return path
