"""What every request costs the web beside its view: Flask's question of each hook and view
whether it is a coroutine function is asked once per function, not on every request."""

from __future__ import annotations

import flask.app

from payment_helpers import JSON


def test_a_page_asked_again_asks_no_hook_or_view_if_it_is_async(shop, monkeypatch):
    asked: list[object] = []
    real = flask.app.iscoroutinefunction

    def counting(func):
        asked.append(func)
        return real(func)

    monkeypatch.setattr(flask.app, "iscoroutinefunction", counting)
    client = shop.test_client()
    assert client.get("/orders", headers=JSON).status_code == 200
    assert asked  # the first request asked of each function once
    asked.clear()

    assert client.get("/orders", headers=JSON).status_code == 200
    assert client.get("/orders", headers=JSON).status_code == 200
    assert asked == []
