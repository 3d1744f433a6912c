"""The demo's mail in the console: while SMTP_URL is unset the mailer writes every email as an .eml
file under instance/mail/ (shop.mailer), named by the order's reference; `GET /console/mail` lists
them newest first with subject and recipient, and `GET /console/mail/<name>` shows one. With
SMTP_URL set the mail went to the mail server, and the page says so."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from email import message_from_binary_file
from email.header import decode_header, make_header
from email.message import Message
from email.parser import BytesHeaderParser

from flask import current_app, url_for

from ..domain.timestamps import iso
from ..web.answers import respond
from .answers import problem
from .blueprint import bp

# The newest this many files: the demo's folder grows with every order, and the page stays a page.
MOST_LISTED = 200
# What the mailer names a file (`<reference>-<template>[-<tag>].eml`): nothing else is opened.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.eml$")
_REFERENCE = re.compile(r"^(BK-[A-Z0-9]+)-")


def mail_folder() -> str:
    return os.path.join(current_app.instance_path, "mail")


def _words(value: str | None) -> str:
    """A header as a person reads it (an encoded name decoded)."""
    return str(make_header(decode_header(value))) if value else ""


def _summary(name: str, path: str, headers: Message) -> dict:
    found = _REFERENCE.match(name)
    return {
        "name": name,
        "subject": _words(headers["Subject"]),
        "to": _words(headers["To"]),
        "written_at": iso(datetime.fromtimestamp(os.stat(path).st_mtime, UTC)),
        "reference": found.group(1) if found else None,
    }


def _listing(folder: str) -> list[dict]:
    try:
        names = [n for n in os.listdir(folder) if _NAME.match(n)]
    except FileNotFoundError:
        return []
    paths = sorted(((os.stat(os.path.join(folder, n)).st_mtime, n) for n in names), reverse=True)[:MOST_LISTED]
    listed = []
    for _mtime, name in paths:
        path = os.path.join(folder, name)
        with open(path, "rb") as fh:
            listed.append(_summary(name, path, BytesHeaderParser().parse(fh)))
    return listed


@bp.get("/mail")
def mail():
    """The demo's emails, newest first (at most MOST_LISTED), or where the mail goes instead."""
    to_files = not current_app.config.get("SMTP_URL")
    folder = mail_folder()
    data = {"to_files": to_files, "folder": folder if to_files else None, "most": MOST_LISTED}
    data["messages"] = _listing(folder) if to_files else []
    return respond("console/mail.html", data)


def _text(message: Message) -> str:
    """The plain text part (every email has one; the receipt's HTML is the same facts)."""
    for part in message.walk():
        payload = part.get_payload(decode=True) if part.get_content_type() == "text/plain" else None
        if isinstance(payload, bytes):
            return payload.decode(part.get_content_charset() or "utf-8", errors="replace")
    return ""


@bp.get("/mail/<name>")
def mail_message(name):
    """One email as the customer got it: its headers and its text."""
    path = os.path.join(mail_folder(), name)
    if current_app.config.get("SMTP_URL") or not _NAME.match(name) or not os.path.isfile(path):
        return problem(
            404, f"There is no email {name} in the mail folder.", title="No such email", back=url_for("console.mail")
        )
    with open(path, "rb") as fh:
        message = message_from_binary_file(fh)
    data = _summary(name, path, message)
    data.update(
        sender=_words(message["From"]),
        reply_to=_words(message["Reply-To"]) or None,
        date=message["Date"],
        text=_text(message),
        html=any(p.get_content_type() == "text/html" for p in message.walk()),
    )
    return respond("console/mail_message.html", data)
