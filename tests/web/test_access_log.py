"""The demo web's access log keeps a URL's query after its "?" and never writes an order's
private access token (shop/devserver/access_log.py; the whole `flask shop up` run is checked in
tests/processes/test_devserver.py)."""

from __future__ import annotations

import pytest

from shop.devserver.access_log import logged_query


@pytest.mark.parametrize(
    ("query", "logged"),
    [
        ("", ""),
        ("page=2", "?page=2"),
        ("token=s3cr3t", "?token=[hidden]"),
        ("token=s3cr3t&page=2", "?token=[hidden]&page=2"),
        ("session_id=cs_test_a1b2c3d4e5f6", "?session_id=[hidden]"),
        ("q=cs_test_a1b2c3d4e5f6", "?q=cs_test_a1b2c3..."),
        ("q=a%20b&token=", "?q=a+b&token=[hidden]"),
        ("token", "?[hidden]"),  # not a name=value pair: hidden whole, since it names the field
    ],
)
def test_the_access_log_keeps_the_query_and_hides_the_access_token_and_the_session_id(query, logged):
    assert logged_query(query) == logged
    assert "s3cr3t" not in logged_query(query) and "d4e5f6" not in logged_query(query)


class _Answer:
    """What gunicorn hands its logger of an answer: its status and the bytes sent."""

    status = "200 OK"
    sent = 12
    headers: list = []


def _access_line(path: str, query: str, capsys) -> str:
    from datetime import timedelta

    from gunicorn.config import Config

    from shop.devserver.access_log import AccessLog

    cfg = Config()
    cfg.set("accesslog", "-")
    cfg.set("access_log_format", "%(m)s %(U)s%(q)s -> %(s)s | %(r)s | %({referer}i)s")
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "RAW_URI": path + ("?" + query if query else ""),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "203.0.113.9",
    }
    headers = [("REFERER", "https://x.example/\nforged referer line")]
    AccessLog(cfg).access(_Answer(), headers, environ, timedelta(milliseconds=3))
    return capsys.readouterr().out


def test_a_newline_in_the_path_forges_no_line_of_the_access_log(capsys):
    # `/orders/x%0a127.0.0.1 GET /console -> 200`: gunicorn decodes the %0a into PATH_INFO.
    written = _access_line("/orders/x\n203.0.113.1 - GET /console/ -> 200\x1b[2J", "", capsys)
    assert written.count("\n") == 1, written
    assert "x\\x0a203.0.113.1" in written and "\\x1b[2J" in written and "/\\x0aforged referer" in written


def test_the_request_line_of_the_access_log_hides_the_token_and_the_session_id(capsys):
    written = _access_line("/checkout/return", "session_id=cs_test_a1b2c3d4e5f6&token=s3cr3t", capsys)
    assert "s3cr3t" not in written and "d4e5f6" not in written and "session_id=[hidden]" in written
