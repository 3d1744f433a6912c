"""The hosted payment page a customer is sent to: `GET /pay/<session_id>`.

It shows the order and four buttons; a session created with `shipping_address_collection` also
asks where to ship (name, address, and a country among its `allowed_countries`), checks it before
any button takes effect, and keeps it on the session (`collected_information.shipping_details`).
Pay and both "pay later" choices send the customer to the session's success_url (with
`{CHECKOUT_SESSION_ID}` filled in), as Checkout does; a "pay later" choice settles on its own a
couple of seconds later. Decline keeps the customer on the page with the card error, and the
session stays payable.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, redirect, render_template_string, request

from .state import HOSTED_ASYNC_SETTLE_SECONDS, SHIPPING_FIELDS, ControlError, Sandbox, format_money, shipping_problems

bp = Blueprint("stripe_sandbox_hosted", __name__)

CHOICES = {
    "pay": ("paid", None),
    "decline": ("declined", None),
    "async_succeeds": ("async_pending", "succeeded"),
    "async_fails": ("async_pending", "failed"),
}

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · Stripe sandbox</title>
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; background: #f6f9fc;
         color: #1a1f36; margin: 0; }
  main { max-width: 28rem; margin: 3rem auto; background: #fff; border-radius: 8px;
         box-shadow: 0 2px 12px rgba(26,31,54,.12); padding: 2rem; }
  .badge { display: inline-block; font-size: .75rem; font-weight: 600; color: #a05a00;
           background: #fff3d6; border-radius: 4px; padding: .1rem .4rem; }
  h1 { font-size: 1.25rem; margin: .75rem 0 1.25rem; }
  table { width: 100%; border-collapse: collapse; margin-bottom: 1.25rem; }
  td { padding: .4rem 0; border-bottom: 1px solid #e3e8ee; }
  td.num { text-align: right; white-space: nowrap; }
  tr.total td { font-weight: 700; border-bottom: none; padding-top: .75rem; }
  .notice { padding: .75rem 1rem; border-radius: 6px; margin-bottom: 1rem; }
  .error { background: #fde8e8; color: #9b1c1c; }
  .info { background: #e8f0fe; color: #1a3e8a; }
  form { margin: 0; }
  button { width: 100%; padding: .7rem; margin-top: .5rem; font-size: 1rem; border-radius: 6px;
           border: 1px solid #cfd7df; background: #fff; cursor: pointer; }
  button.primary { background: #635bff; border-color: #635bff; color: #fff; font-weight: 600; }
  button:hover { filter: brightness(.96); }
  .small { font-size: .85rem; color: #697386; margin-top: 1.25rem; overflow-wrap: anywhere; }
  a { color: #4f46e5; }
  fieldset { border: 1px solid #e3e8ee; border-radius: 6px; margin: 0 0 1rem; padding: .75rem 1rem 1rem; }
  legend { font-weight: 600; padding: 0 .25rem; }
  label { display: block; font-size: .9rem; margin: .6rem 0 .2rem; }
  input, select { box-sizing: border-box; width: 100%; padding: .55rem; font-size: 1rem;
                  border: 1px solid #8792a2; border-radius: 6px; background: #fff; color: #1a1f36; }
  [aria-invalid="true"] { border-color: #9b1c1c; }
  .field-error { color: #9b1c1c; font-size: .85rem; margin: .2rem 0 0; }
</style>
</head>
<body>
<main>
  <span class="badge">TEST MODE · Stripe sandbox</span>
  <h1>{{ title }}</h1>
  {% if session %}
  <table>
    {% for line in session.line_items %}
    <tr><td>{{ line.name }} × {{ line.quantity }}</td><td class="num">{{ money(line.amount) }}</td></tr>
    {% endfor %}
    <tr class="total"><td>Total</td><td class="num">{{ money(session.amount_total) }}</td></tr>
  </table>
  {% endif %}
  {% if error %}<div class="notice error" role="alert">{{ error }}</div>{% endif %}
  {% if message %}<div class="notice info">{{ message }}</div>{% endif %}
  {% if payable %}
  <form method="post" novalidate>
    {% if session.collects_shipping %}
    <fieldset>
      <legend>Shipping address</legend>
      {% for name, label, required, autocomplete in address_fields %}
      <label for="ship-{{ name }}">{{ label }}</label>
      {% set invalid = ' aria-invalid="true" aria-describedby="ship-%s-error"'|format(name) if problems.get(name) %}
      {% if name == "country" %}
      <select id="ship-{{ name }}" name="{{ name }}" autocomplete="{{ autocomplete }}"
              {%- if required %} required{% endif %}{{ (invalid or '')|safe }}>
        {% for code in session.shipping_countries %}
        <option value="{{ code }}"{% if values.get(name, "").upper() == code %} selected{% endif %}>
          {{- country_name(code) }}</option>
        {% endfor %}
      </select>
      {% else %}
      <input id="ship-{{ name }}" name="{{ name }}" value="{{ values.get(name, '') }}"
             autocomplete="{{ autocomplete }}" maxlength="200"
             {%- if required %} required{% endif %}{{ (invalid or '')|safe }}>
      {% endif %}
      {% if problems.get(name) %}<p class="field-error" id="ship-{{ name }}-error">{{ problems[name] }}</p>{% endif %}
      {% endfor %}
    </fieldset>
    {% endif %}
    <button class="primary" name="choice" value="pay">Pay {{ money(session.amount_total) }}</button>
    <button name="choice" value="decline">Decline</button>
    <button name="choice" value="async_succeeds">Pay later (async: succeeds)</button>
    <button name="choice" value="async_fails">Pay later (async: fails)</button>
  </form>
  {% if session.cancel_url %}<p class="small"><a href="{{ session.cancel_url }}">← Back to the shop</a></p>{% endif %}
  {% endif %}
  {% if session %}<p class="small">Session {{ session.id }}</p>{% endif %}
</main>
</body>
</html>
"""


# The browser's autofill names for the address form's fields (WHATWG autocomplete tokens).
_AUTOCOMPLETE = {
    "name": "shipping name",
    "line1": "shipping address-line1",
    "line2": "shipping address-line2",
    "city": "shipping address-level2",
    "postal_code": "shipping postal-code",
    "state": "shipping address-level1",
    "country": "shipping country",
}
ADDRESS_FIELDS = tuple((name, label, required, _AUTOCOMPLETE[name]) for name, label, required in SHIPPING_FIELDS)
_COUNTRY_NAMES = {
    "US": "United States", "CA": "Canada", "GB": "United Kingdom", "IE": "Ireland", "FR": "France",
    "DE": "Germany", "NL": "Netherlands", "BE": "Belgium", "AT": "Austria", "ES": "Spain", "IT": "Italy",
    "PT": "Portugal", "SE": "Sweden", "DK": "Denmark", "FI": "Finland", "NO": "Norway", "CH": "Switzerland",
    "AU": "Australia", "NZ": "New Zealand", "JP": "Japan",
}  # fmt: skip


def country_name(code: str) -> str:
    return _COUNTRY_NAMES.get(code, code)


def _sandbox() -> Sandbox:
    return current_app.extensions["stripe_sandbox"]


def _page(session, *, title: str, status: int = 200, error=None, message=None, values=None, problems=None) -> Response:
    html = render_template_string(
        PAGE,
        title=title,
        session=session,
        error=error,
        message=message,
        values=values or {},
        problems=problems or {},
        address_fields=ADDRESS_FIELDS,
        country_name=country_name,
        payable=session is not None and session.status == "open",
        money=lambda amount: format_money(amount, session.currency),
    )
    return Response(html, status=status, mimetype="text/html")


def _closed_message(sandbox: Sandbox, session) -> str:
    if session.status == "expired":
        return "This checkout session has expired. Return to the shop to start a new payment."
    if session.payment_status == "paid":
        return "This order is paid. Thank you!"
    if sandbox.is_async_pending(session):
        return "Your payment is processing. You will hear from the shop once it clears."
    intent = sandbox.payment_intents.get(session.payment_intent_id or "")
    if intent is not None and intent.status == "requires_capture":
        return "Your card is authorized. You are charged when the shop takes the payment."
    if intent is not None and intent.latest_charge and intent.status == "canceled":
        return "The authorization on your card was released. Nothing was charged."
    return "This payment did not go through. Return to the shop to try again."


@bp.get("/pay/<session_id>")
def show(session_id: str) -> Response:
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        session = sandbox.sessions.get(session_id)
        if session is None:
            return _page(None, title="Checkout session not found", status=404,
                         error="There is no checkout session with this link.")  # fmt: skip
        if session.status != "open":
            return _page(session, title="Checkout", message=_closed_message(sandbox, session))
        return _page(session, title="Checkout")


@bp.post("/pay/<session_id>")
def choose(session_id: str) -> Response:
    choice = request.form.get("choice", "")
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        session = sandbox.sessions.get(session_id)
        if session is None:
            return _page(None, title="Checkout session not found", status=404,
                         error="There is no checkout session with this link.")  # fmt: skip
        if choice not in CHOICES:
            return _page(session, title="Checkout", status=400, error="Please choose a button.")
        outcome, later = CHOICES[choice]
        details = None
        if session.collects_shipping and session.status == "open":
            values = {name: request.form.get(name, "") for name, *_ in SHIPPING_FIELDS}
            details, problems = shipping_problems(session, values)
            if problems:
                return _page(session, title="Checkout", status=400, values=values, problems=problems,
                             error="Please check the shipping address: " + " ".join(problems.values()))  # fmt: skip
        try:
            sandbox.apply_outcome(session_id, outcome, details)
        except ControlError:
            return _page(session, title="Checkout", status=409,
                         message=_closed_message(sandbox, session))  # fmt: skip
        if outcome == "declined":
            kept = {name: request.form.get(name, "") for name, *_ in SHIPPING_FIELDS}
            return _page(session, title="Checkout", status=402, values=kept,
                         error="Your card was declined. Please try again.")  # fmt: skip
        if later is not None:
            sandbox.schedule_async(session_id, later, HOSTED_ASYNC_SETTLE_SECONDS)
        success_url = session.success_url
    if success_url is None:
        return _page(session, title="Checkout", message=_closed_message(sandbox, session))
    return redirect(success_url.replace("{CHECKOUT_SESSION_ID}", session_id), code=303)


INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Stripe sandbox</title>
<style>body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;color:#1a1f36}
td,th{padding:.3rem .6rem;text-align:left;border-bottom:1px solid #e3e8ee}</style></head>
<body><h1>Stripe sandbox</h1>
<p>API base: <code>{{ base }}</code> · clock: {{ now }} · control routes under <code>/_sandbox</code></p>
<table><tr><th>session</th><th>status</th><th>payment</th><th>total</th><th>reference</th></tr>
{% for s in sessions %}<tr><td><a href="/pay/{{ s.id }}">{{ s.id[:22] }}…</a></td><td>{{ s.status }}</td>
<td>{{ s.payment_status }}</td><td>{{ s.amount_total }} {{ s.currency }}</td>
<td>{{ s.client_reference_id or "" }}</td></tr>{% endfor %}</table></body></html>
"""


@bp.get("/")
def index() -> Response:
    """A small overview for people running the demo: recent sessions with their pay links."""
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        sessions = sandbox.newest_first(sandbox.sessions.values())[:50]
        html = render_template_string(INDEX, sessions=sessions, now=sandbox.now(), base=request.host_url.rstrip("/"))
    return Response(html, mimetype="text/html")
