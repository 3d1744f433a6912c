"""The demo's mail in the console (docs/REFERENCE.md, Console): with SMTP_URL unset every email is
an .eml file named by the order's reference, and `/console/mail` lists them newest first with
subject and recipient, each one opening as the customer got it; nothing outside the mail folder
opens, and with SMTP_URL set the page says where the mail went instead."""

from __future__ import annotations

import os

import pytest

from factories import seed_catalog_rows
from payment_helpers import JSON, Shopper, run_everything
from support import log_in


@pytest.fixture
def mail_app(fresh_paying_app, tmp_path):
    """A paying app whose mail goes to files in this test's own folder (order ids restart every test)."""
    fresh_paying_app.instance_path = str(tmp_path)
    assert not fresh_paying_app.config.get("SMTP_URL")
    return fresh_paying_app


def test_the_mail_page_lists_the_demos_emails_newest_first_and_opens_each_as_sent(mail_app, sandbox):
    app = mail_app
    shopper = Shopper(app, seed_catalog_rows(app))
    first = shopper.place()
    assert shopper.cancel(first["reference"], first["version"]).status_code == 200
    run_everything(app)
    second = shopper.place()
    assert shopper.cancel(second["reference"], second["version"]).status_code == 200
    run_everything(app)
    folder = os.path.join(app.instance_path, "mail")
    older = os.path.join(folder, f"{first['reference']}-order_cancelled-event.eml")
    os.utime(older, (1_000_000_000, 1_000_000_000))  # written long ago: listed last

    operator = app.test_client()
    log_in(app, operator)
    listed = operator.get("/console/mail", headers=JSON).get_json()
    assert listed["to_files"] is True and listed["folder"] == folder
    names = [m["name"] for m in listed["messages"]]
    assert names[-1] == os.path.basename(older)
    assert f"{second['reference']}-order_cancelled-event.eml" in names
    newest = listed["messages"][0]
    assert newest["reference"] == second["reference"] and newest["to"] == shopper.email
    assert newest["subject"] == f"Your order {second['reference']} is cancelled"

    page = operator.get("/console/mail").get_data(as_text=True)
    assert page.index(second["reference"]) < page.index(first["reference"])

    one = operator.get(f"/console/mail/{os.path.basename(older)}", headers=JSON).get_json()
    assert one["sender"] == "Backstop shop <shop@localhost>" and one["to"] == shopper.email
    assert f"/orders/{first['reference']}?token=" in one["text"] and "As you asked" in one["text"]
    html = operator.get(f"/console/mail/{os.path.basename(older)}").get_data(as_text=True)
    assert "As you asked" in html


@pytest.mark.parametrize("name", ["..%2Fbackstop.sqlite3", "BK-NOSUCH-order_paid-event.eml", "notes.txt"])
def test_only_an_eml_file_of_the_mail_folder_opens(mail_app, name):
    os.makedirs(mail_app.instance_path, exist_ok=True)
    with open(os.path.join(mail_app.instance_path, "notes.txt"), "w") as fh:
        fh.write("not an email")
    operator = mail_app.test_client()
    log_in(mail_app, operator)
    assert operator.get(f"/console/mail/{name}", headers=JSON).status_code == 404


def test_with_smtp_the_mail_page_says_mail_went_to_the_server_and_lists_nothing(make_fresh_app, tmp_path):
    app = make_fresh_app(SMTP_URL="smtp://127.0.0.1:2525")
    app.instance_path = str(tmp_path)
    folder = os.path.join(app.instance_path, "mail")
    os.makedirs(folder)
    with open(os.path.join(folder, "BK-OLD00000-order_paid-event.eml"), "wb") as fh:
        fh.write(b"Subject: from before\r\n\r\nold")
    operator = app.test_client()
    log_in(app, operator)
    listed = operator.get("/console/mail", headers=JSON).get_json()
    assert listed["to_files"] is False and listed["messages"] == []
    assert "mail server in SMTP_URL" in operator.get("/console/mail").get_data(as_text=True)
    assert operator.get("/console/mail/BK-OLD00000-order_paid-event.eml", headers=JSON).status_code == 404
