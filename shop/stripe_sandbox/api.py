"""Stripe's /v1 API surface: authentication, params, idempotency, lists, errors.

Each view reads Stripe's form-encoded params, validates them with Stripe's messages, calls
one `Sandbox` operation and renders the result. `stripe_view` wraps every view in the things
all of /v1 shares: the sandbox lock (one request is one atomic step), expiry checks before
the view sees any session, Idempotency-Key replay for POSTs, and the error envelope.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

from flask import Blueprint, Response, current_app, g, request

from .account import PAYMENT_METHOD_TYPES, VOUCHER_DAYS, Account, is_api_version
from .errors import StripeError, invalid, missing_param
from .forms import (
    merge_metadata,
    param_name,
    parse_form,
    read_bool,
    read_dict,
    read_int,
    read_list,
    read_metadata,
    read_str,
    reject_unknown,
)
from .objects import (
    API_VERSION,
    LineItem,
    new_id,
    render_charge,
    render_event,
    render_payment_intent,
    render_refund,
    render_session,
    render_webhook_endpoint,
)
from .state import RequestRef, Sandbox, StoredResponse
from .traffic import RATE_WINDOW_SECONDS

bp = Blueprint("stripe_sandbox_v1", __name__, url_prefix="/v1")

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_EVENT_TYPE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
_CURRENCY = re.compile(r"^[a-z]{3}$")
# Stripe refuses a unit_amount above eight digits ($999,999.99 in a two-decimal currency).
MAX_UNIT_AMOUNT = 99_999_999
LIST_PARAMS = ("limit", "starting_after", "ending_before", "created", "expand")
REFUND_REASONS = ("duplicate", "fraudulent", "requested_by_customer")


def _sandbox() -> Sandbox:
    return current_app.extensions["stripe_sandbox"]


@dataclass
class Call:
    """What a view needs to know about the HTTP request besides its params."""

    request_id: str
    idempotency_key: str | None
    base_url: str

    @property
    def ref(self) -> RequestRef:
        return RequestRef(self.request_id, self.idempotency_key)


# ---------------------------------------------------------------------------------------
# Plumbing shared by every /v1 route


def json_response(status: int, body: bytes, extra_headers: dict | None = None) -> Response:
    response = Response(body, status=status, mimetype="application/json")
    response.headers["Request-Id"] = g.get("request_id") or new_id("req_", 14)
    response.headers["Stripe-Version"] = API_VERSION
    for key, value in (extra_headers or {}).items():
        response.headers[key] = value
    return response


def error_response(error: StripeError) -> Response:
    return json_response(error.status, _dump(error.body()))


def _dump(body: Any) -> bytes:
    return json.dumps(body, indent=2).encode("utf-8")


@bp.before_request
def _gate():
    """Faults first (latency and hang hold the call, then an outage or the rate limit answer
    it), then the API key. Nothing here holds `Sandbox.lock`."""
    g.request_id = new_id("req_", 14)
    sandbox = _sandbox()
    sandbox.api_gate.hold()
    if sandbox.faults.api_unavailable:
        return error_response(
            StripeError(
                503,
                "The Stripe sandbox is simulating an outage (api_unavailable). Please try again later.",
                type="api_error",
            )
        )
    faults = sandbox.faults
    if sandbox.api_gate.refuse_next(faults):
        return _rate_limited("next", RATE_WINDOW_SECONDS, faults)
    refused = sandbox.api_gate.admit(
        faults.api_rate_limit_per_second, endpoint(), faults.api_endpoint_rate_limit_per_second
    )
    if refused is not None:
        return _rate_limited(*refused, faults)
    key = _api_key()
    if key is None:
        return error_response(
            StripeError(
                401,
                "You did not provide an API key. You need to provide your API key in the "
                "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
                "YOUR_SECRET_KEY').",
            )
        )
    if not key.startswith(("sk_", "rk_")):
        return error_response(StripeError(401, f"Invalid API Key provided: {_redact(key)}"))
    g.api_key = key
    return None


def endpoint() -> str:
    """The endpoint a /v1 call is counted against, as Stripe counts its per-endpoint limits:
    the method and the path template (`POST /v1/checkout/sessions`,
    `GET /v1/checkout/sessions/{id}`), not the path with the object's id in it."""
    rule = request.url_rule
    path = _PATH_VARIABLE.sub("{id}", rule.rule) if rule is not None else request.path
    return f"{request.method} {path}"


_PATH_VARIABLE = re.compile(r"<(?:[^<>:]+:)?[^<>]+>")


def _rate_limited(which: str, retry_after: float, faults) -> Response:
    """Stripe's answer to too many requests: a 429 `rate_limit` error the SDK raises as
    `RateLimitError`. `Stripe-Should-Retry: true` because nothing was done, so a retry is
    always safe; `Retry-After` says when a slot frees (whole seconds, as HTTP requires)."""
    if which == "endpoint":
        limit = faults.api_endpoint_rate_limit_per_second
        scope = (
            f"{endpoint()} to {limit} request{'s' if limit != 1 else ''} per second "
            "(api_endpoint_rate_limit_per_second)"
        )
    elif which == "next":
        scope = f"this call and {faults.api_rate_limit_next_calls} more (api_rate_limit_next_calls)"
    else:
        limit = faults.api_rate_limit_per_second
        scope = f"this account to {limit} request{'s' if limit != 1 else ''} per second (api_rate_limit_per_second)"
    error = StripeError(
        429,
        f"Too many requests hit the API too quickly: the Stripe sandbox is limiting {scope}. Back off and retry.",
        code="rate_limit",
        saved=False,
        extra={"doc_url": "https://stripe.com/docs/error-codes/rate-limit"},
    )
    return json_response(
        429,
        _dump(error.body()),
        {"Stripe-Should-Retry": "true", "Retry-After": str(max(1, math.ceil(retry_after)))},
    )


def _api_key() -> str | None:
    header = request.headers.get("Authorization", "").strip()
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and credential:
        return credential
    if scheme.lower() == "basic" and credential:
        try:
            return base64.b64decode(credential).decode("utf-8").split(":", 1)[0] or None
        except ValueError:
            return None
    return None


def _redact(key: str) -> str:
    return key[:8] + "*" * 4 + key[-4:] if len(key) > 12 else "*" * len(key)


def stripe_view(view: Callable[..., Any]) -> Callable[..., Response]:
    """Run a view as one atomic, idempotent Stripe API call."""

    @functools.wraps(view)
    def wrapper(**route_args: Any) -> Response:
        sandbox = _sandbox()
        method = request.method
        try:
            raw = (
                request.get_data(cache=True).decode("utf-8")
                if method == "POST"
                else request.query_string.decode("utf-8")
            )
            params = parse_form(parse_qsl(raw, keep_blank_values=True))
        except UnicodeDecodeError:
            return error_response(invalid("The request body is not valid UTF-8."))
        except StripeError as error:
            return error_response(error)

        key = request.headers.get("Idempotency-Key") if method == "POST" else None
        if key is not None and len(key) > 255:
            return error_response(invalid("Invalid Idempotency-Key: must be at most 255 characters long."))
        call = Call(g.request_id, key, request.host_url)
        fingerprint = json.dumps(params, sort_keys=True)
        with sandbox.lock:
            sandbox.tick()
            if key is not None:
                stored = sandbox.idempotency.get((g.api_key, key))
                if stored is not None:
                    return _replay(stored, key, method, request.path, fingerprint)
            locked = sandbox.lock_timeout(_written_object(sandbox, method, params, route_args))
            if locked is not None:
                # Stripe asks the client to retry a lock timeout (the SDKs do, with backoff).
                retry = {"Stripe-Should-Retry": "true", **({"Idempotency-Key": key} if key is not None else {})}
                return json_response(locked.status, _dump(locked.body()), retry)
            try:
                status, body, saved = 200, _dump(view(sandbox, params, call, **route_args)), True
            except StripeError as error:
                status, body, saved = error.status, _dump(error.body()), error.saved
            if key is not None and saved:
                sandbox.idempotency[(g.api_key, key)] = StoredResponse(
                    method, request.path, fingerprint, status, body, g.request_id
                )
        headers = {"Idempotency-Key": key} if key is not None else {}
        return json_response(status, body, headers)

    return wrapper


def _written_object(sandbox: Sandbox, method: str, params: dict, route_args: dict) -> str | None:
    """The existing object a write changes, as Stripe locks it: the one in the URL (a session
    expired, an endpoint updated or deleted), or the payment a refund is taken from (named by
    `payment_intent`, or by a `charge` of it). None for a read or a create of a new object."""
    if method not in ("POST", "DELETE"):
        return None
    if route_args:
        return str(next(iter(route_args.values())))
    if request.path == "/v1/refunds":
        charge = params.get("charge")
        if isinstance(charge, str) and charge in sandbox.charges:
            return sandbox.charges[charge].payment_intent_id
        target = params.get("payment_intent") or charge
        return target if isinstance(target, str) and target else None
    return None


def _replay(stored: StoredResponse, key: str, method: str, path: str, fingerprint: str) -> Response:
    if (stored.method, stored.path) != (method, path):
        return error_response(
            StripeError(
                400,
                "Keys for idempotent requests can only be used for the same endpoint they "
                f"were first used for ('{stored.method} {stored.path}' vs '{method} {path}'). "
                f"Try using a key other than '{key}' if you meant to execute a different "
                "request.",
                type="idempotency_error",
                saved=False,
            )
        )
    if stored.fingerprint != fingerprint:
        return error_response(
            StripeError(
                400,
                "Keys for idempotent requests can only be used with the same parameters "
                f"they were first used with. Try using a key other than '{key}' if you "
                "meant to execute a different request.",
                type="idempotency_error",
                saved=False,
            )
        )
    return json_response(
        stored.status,
        stored.body,
        {
            "Idempotency-Key": key,
            "Idempotent-Replayed": "true",
            "Original-Request": stored.request_id,
        },
    )


def _expand(params: dict, allowed: set[str]) -> set[str]:
    paths = read_list(params.get("expand"), "expand") or []
    for index, path in enumerate(paths):
        if not isinstance(path, str) or path not in allowed:
            raise invalid(f"This property cannot be expanded ({path}).", param_name("expand", index))
    return set(paths)


def _list(
    sandbox: Sandbox,
    records: list,
    params: dict,
    url: str,
    render: Callable[[Any], dict],
) -> dict:
    """Stripe's cursor pagination over records, newest first."""
    limit = read_int(params.get("limit"), "limit", minimum=1)
    limit = 10 if limit is None else limit
    if limit > 100:
        raise invalid("This value must be less than or equal to 100.", "limit")
    records = _filter_created(sandbox.newest_first(records), params.get("created"))
    starting_after = read_str(params.get("starting_after"), "starting_after")
    ending_before = read_str(params.get("ending_before"), "ending_before")
    ids = [record.id for record in records]
    if starting_after is not None:
        if starting_after not in ids:
            raise invalid(f"No such object: '{starting_after}'", "starting_after", "resource_missing")
        start = ids.index(starting_after) + 1
        page, has_more = records[start : start + limit], len(records) > start + limit
    elif ending_before is not None:
        if ending_before not in ids:
            raise invalid(f"No such object: '{ending_before}'", "ending_before", "resource_missing")
        end = ids.index(ending_before)
        page, has_more = records[max(0, end - limit) : end], end - limit > 0
    else:
        page, has_more = records[:limit], len(records) > limit
    return {"object": "list", "data": [render(r) for r in page], "has_more": has_more, "url": url}


def _filter_created(records: list, created: Any) -> list:
    if created is None or created == "":
        return records
    if isinstance(created, str):
        exact = read_int(created, "created")
        return [r for r in records if r.created == exact]
    bounds = read_dict(created, "created") or {}
    reject_unknown(bounds, ("gt", "gte", "lt", "lte"))
    checks = {
        "gt": lambda a, b: a > b,
        "gte": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "lte": lambda a, b: a <= b,
    }
    for op, raw in bounds.items():
        value = read_int(raw, f"created[{op}]")
        records = [r for r in records if checks[op](r.created, value)]
    return records


def _read_url(value: Any, param: str, *, required: bool = False) -> str | None:
    url = read_str(value, param, max_length=5000)
    if url is None:
        if required:
            raise missing_param(param)
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise invalid("Not a valid URL", param, "url_invalid")
    return url


# ---------------------------------------------------------------------------------------
# Checkout Sessions

SESSION_CREATE_PARAMS = (
    "mode", "line_items", "client_reference_id", "metadata", "success_url", "cancel_url",
    "customer_email", "expires_at", "expand", "payment_method_types", "locale",
    "payment_intent_data", "submit_type", "billing_address_collection", "ui_mode",
    "customer_creation", "shipping_address_collection", "automatic_tax", "adaptive_pricing",
    "allowed_payment_method_types", "excluded_payment_method_types", "payment_method_options",
)  # fmt: skip


# What a session's answer can expand: its PaymentIntent, and that intent's latest Charge (which
# says how much of the payment was refunded).
SESSION_EXPANDS = {"payment_intent", "payment_intent.latest_charge"}


def _render_session(sandbox: Sandbox, session, expand: set[str], prefix: str = "") -> dict:
    body = render_session(session)
    with_charge = f"{prefix}payment_intent.latest_charge" in expand
    if (f"{prefix}payment_intent" in expand or with_charge) and session.payment_intent_id:
        intent = sandbox.payment_intents[session.payment_intent_id]
        body["payment_intent"] = render_payment_intent(intent)
        if with_charge and intent.latest_charge in sandbox.charges:
            body["payment_intent"]["latest_charge"] = render_charge(sandbox.charges[intent.latest_charge])
    return body


@bp.post("/checkout/sessions")
@stripe_view
def create_checkout_session(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, SESSION_CREATE_PARAMS)
    expand = _expand(params, SESSION_EXPANDS)
    mode = read_str(params.get("mode"), "mode")
    if mode is None:
        raise missing_param("mode")
    if mode in ("setup", "subscription"):
        raise invalid(f"The Stripe sandbox supports only mode=payment, not {mode}.", "mode")
    if mode != "payment":
        raise invalid("Invalid mode: must be one of payment, setup, or subscription", "mode")
    ui_mode = read_str(params.get("ui_mode"), "ui_mode")
    if ui_mode not in (None, "hosted"):
        raise invalid("The Stripe sandbox supports only ui_mode=hosted.", "ui_mode")
    if "payment_method_types" in params:
        # Removed from session create in 2026-09-30.endive: the account's dynamic payment methods
        # decide, narrowed by allowed_ or excluded_payment_method_types.
        raise invalid(
            "payment_method_types is no longer supported when creating a Checkout Session: the "
            "account's payment methods apply; use allowed_payment_method_types or "
            "excluded_payment_method_types to narrow them.",
            "payment_method_types",
            "payment_method_types_no_longer_supported",
        )
    line_items = _read_line_items(params.get("line_items"))
    account = sandbox.account
    payment_method_types = _read_payment_method_types(params, account)
    customer_email = read_str(params.get("customer_email"), "customer_email", max_length=512)
    if customer_email is not None and not _EMAIL.match(customer_email):
        raise invalid(f"Invalid email address: {customer_email}", "customer_email", "email_invalid")
    intent_data = read_dict(params.get("payment_intent_data"), "payment_intent_data") or {}
    session = sandbox.create_session(
        line_items=line_items,
        base_url=call.base_url,
        success_url=_read_url(params.get("success_url"), "success_url"),
        cancel_url=_read_url(params.get("cancel_url"), "cancel_url"),
        client_reference_id=read_str(params.get("client_reference_id"), "client_reference_id", max_length=200),
        customer_email=customer_email,
        metadata=read_metadata(params.get("metadata")),
        payment_intent_metadata=read_metadata(intent_data.get("metadata"), "payment_intent_data[metadata]"),
        expires_at=read_int(params.get("expires_at"), "expires_at"),
        locale=read_str(params.get("locale"), "locale"),
        shipping_countries=_read_shipping_collection(params.get("shipping_address_collection")),
        automatic_tax=_read_automatic_tax(params.get("automatic_tax"), account),
        adaptive_pricing=_read_enabled(
            params.get("adaptive_pricing"), "adaptive_pricing", account.adaptive_pricing_default
        ),
        payment_method_types=payment_method_types,
        payment_method_options=_read_voucher_options(
            params.get("payment_method_options"), payment_method_types, account
        ),
        capture_method=_read_capture_method(intent_data),
    )
    return _render_session(sandbox, session, expand)


def _read_automatic_tax(value: Any, account: Account) -> bool:
    """`automatic_tax[enabled]` decides when given; else the account's default does."""
    given = read_dict(value, "automatic_tax") or {}
    reject_unknown_nested(given, ("enabled", "liability"), ("automatic_tax",))
    liability = read_dict(given.get("liability"), "automatic_tax[liability]") or {}
    reject_unknown_nested(liability, ("type",), ("automatic_tax", "liability"))
    if liability.get("type") not in (None, "", "self"):
        raise invalid(
            "The Stripe sandbox supports only automatic_tax[liability][type]=self (no Connect accounts).",
            "automatic_tax[liability][type]",
        )
    return _read_enabled(value, "automatic_tax", account.automatic_tax_default == "enabled_when_possible")


def _read_enabled(value: Any, param: str, default: bool) -> bool:
    given = read_dict(value, param) or {}
    if param == "adaptive_pricing":
        reject_unknown_nested(given, ("enabled",), (param,))
    enabled = read_bool(given.get("enabled"), f"{param}[enabled]")
    return default if enabled is None else enabled


def _read_type_list(value: Any, param: str) -> list[str] | None:
    kinds = read_list(value, param)
    if kinds is None:
        return None
    for index, kind in enumerate(kinds):
        if kind not in PAYMENT_METHOD_TYPES:
            raise invalid(
                f"Invalid {param_name(param, index)}: {kind!r} is not a payment method type.", param_name(param, index)
            )
    return kinds


def _read_payment_method_types(params: dict, account: Account) -> list[str]:
    """The account's dynamic payment methods, narrowed by `allowed_payment_method_types` (a filter:
    a type the account does not offer is simply not offered) or `excluded_payment_method_types`,
    never both; refused when nothing is left to offer."""
    allowed = _read_type_list(params.get("allowed_payment_method_types"), "allowed_payment_method_types")
    excluded = _read_type_list(params.get("excluded_payment_method_types"), "excluded_payment_method_types")
    if allowed is not None and excluded is not None:
        raise invalid(
            "You cannot use both allowed_payment_method_types and excluded_payment_method_types.",
            "excluded_payment_method_types",
        )
    kinds = account.payment_method_types(allowed, excluded)
    if not kinds:
        narrowed = f"excluding {', '.join(excluded)}" if excluded else f"allowing only {', '.join(allowed or [])}"
        raise invalid(
            f"No payment method types are left for this Checkout Session after {narrowed}; "
            f"the account offers {', '.join(account.payment_methods)}.",
            "excluded_payment_method_types" if excluded else "allowed_payment_method_types",
        )
    return kinds


CAPTURE_METHODS = ("automatic", "automatic_async", "manual")


def _read_capture_method(intent_data: dict) -> str:
    """`payment_intent_data[capture_method]`: manual holds the payment for a later capture
    whatever the method; automatic_async captures at once, as automatic does."""
    capture = read_str(intent_data.get("capture_method"), "payment_intent_data[capture_method]")
    if capture is None:
        return "automatic"
    if capture not in CAPTURE_METHODS:
        raise invalid(
            f"Invalid payment_intent_data[capture_method]: must be one of {', '.join(CAPTURE_METHODS)}",
            "payment_intent_data[capture_method]",
        )
    return capture


def _read_voucher_options(value: Any, kinds: list[str], account: Account) -> dict:
    """`payment_method_options[<voucher>][expires_after_days]` for OXXO, Boleto and Konbini: each
    voucher type the session offers gets the days given, else the account's default."""
    given = read_dict(value, "payment_method_options") or {}
    reject_unknown_nested(given, (*VOUCHER_DAYS, "card"), ("payment_method_options",))
    options: dict = {}
    card = read_dict(given.get("card"), "payment_method_options[card]") or {}
    reject_unknown_nested(card, ("capture_method",), ("payment_method_options", "card"))
    capture = read_str(card.get("capture_method"), "payment_method_options[card][capture_method]")
    if capture not in (None, "manual"):
        raise invalid(
            "Invalid payment_method_options[card][capture_method]: must be manual",
            "payment_method_options[card][capture_method]",
        )
    if capture is not None and "card" in kinds:
        options["card"] = {"capture_method": capture}
    for kind, (low, high) in VOUCHER_DAYS.items():
        where = ("payment_method_options", kind)
        option = read_dict(given.get(kind), param_name(*where)) or {}
        reject_unknown_nested(option, ("expires_after_days",), where)
        days = read_int(
            option.get("expires_after_days"), param_name(*where, "expires_after_days"), minimum=low, maximum=high
        )
        if kind in kinds:
            options[kind] = {"expires_after_days": account.voucher_expires_after_days if days is None else days}
    return options


_COUNTRY = re.compile(r"^[A-Z]{2}$")


def _read_shipping_collection(value: Any) -> list[str] | None:
    """`shipping_address_collection[allowed_countries][]`: the countries the hosted page lets the
    customer ship to; required (and not empty) once the hash is given, as at Stripe."""
    collection = read_dict(value, "shipping_address_collection")
    if collection is None:
        return None
    reject_unknown_nested(collection, ("allowed_countries",), ("shipping_address_collection",))
    param = "shipping_address_collection[allowed_countries]"
    countries = read_list(collection.get("allowed_countries"), param)
    if not countries:
        raise missing_param(param)
    result: list[str] = []
    for index, country in enumerate(countries):
        name = param_name("shipping_address_collection", "allowed_countries", index)
        country = read_str(country, name)
        if country is None or not _COUNTRY.match(country):
            raise invalid(
                f"Invalid {name}: must be a two-letter country code (ISO 3166-1 alpha-2) in capitals, such as US",
                name,
            )
        if country not in result:
            result.append(country)
    return result


def _read_line_items(value: Any) -> list[LineItem]:
    items = read_list(value, "line_items")
    if not items:
        raise missing_param("line_items")
    if len(items) > 100:
        raise invalid("You may only specify up to 100 line items.", "line_items")
    result: list[LineItem] = []
    for index, item in enumerate(items):
        where = ("line_items", index)
        item = read_dict(item, param_name(*where))
        if item is None:
            raise missing_param(param_name(*where))
        reject_unknown_nested(item, ("price_data", "quantity", "price"), where)
        if item.get("price"):
            raise invalid(
                f"No such price: '{item['price']}' (the Stripe sandbox takes price_data only)",
                param_name(*where, "price"),
                "resource_missing",
            )
        price = read_dict(item.get("price_data"), param_name(*where, "price_data"))
        if price is None:
            raise missing_param(param_name(*where, "price_data"))
        reject_unknown_nested(
            price, ("currency", "unit_amount", "product_data", "tax_behavior"), (*where, "price_data")
        )
        currency = read_str(price.get("currency"), param_name(*where, "price_data", "currency"))
        if currency is None:
            raise missing_param(param_name(*where, "price_data", "currency"))
        currency = currency.lower()
        if not _CURRENCY.match(currency):
            raise invalid(f"Invalid currency: {currency}.", param_name(*where, "price_data", "currency"))
        unit_amount = read_int(
            price.get("unit_amount"),
            param_name(*where, "price_data", "unit_amount"),
            minimum=0,
            maximum=MAX_UNIT_AMOUNT,
        )
        if unit_amount is None:
            raise missing_param(param_name(*where, "price_data", "unit_amount"))
        product = read_dict(price.get("product_data"), param_name(*where, "price_data", "product_data"))
        if product is None:
            raise missing_param(param_name(*where, "price_data", "product_data"))
        reject_unknown_nested(
            product,
            ("name", "description", "images", "metadata", "tax_code"),
            (*where, "price_data", "product_data"),
        )
        name = read_str(product.get("name"), param_name(*where, "price_data", "product_data", "name"))
        if name is None:
            raise missing_param(param_name(*where, "price_data", "product_data", "name"))
        quantity = read_int(item.get("quantity"), param_name(*where, "quantity"), minimum=1)
        if quantity is None:
            raise missing_param(param_name(*where, "quantity"))
        if result and currency != result[0].currency:
            raise invalid(
                "All line items in a Checkout Session must use the same currency "
                f"({result[0].currency} vs {currency}).",
                param_name(*where, "price_data", "currency"),
            )
        result.append(LineItem(name=name, currency=currency, unit_amount=unit_amount, quantity=quantity))
    return result


def reject_unknown_nested(params: dict, allowed: tuple[str, ...], where: tuple) -> None:
    for key in params:
        if key not in allowed:
            raise invalid(
                f"Received unknown parameter: {param_name(*where, key)}",
                param_name(*where, key),
                "parameter_unknown",
            )


@bp.get("/checkout/sessions")
@stripe_view
def list_checkout_sessions(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, (*LIST_PARAMS, "payment_intent", "status"))
    expand = _expand(params, {f"data.{path}" for path in SESSION_EXPANDS})
    records = list(sandbox.sessions.values())
    payment_intent = read_str(params.get("payment_intent"), "payment_intent")
    if payment_intent is not None:
        records = [s for s in records if s.payment_intent_id == payment_intent]
    status = read_str(params.get("status"), "status")
    if status is not None:
        if status not in ("open", "complete", "expired"):
            raise invalid("Invalid status: must be one of complete, expired, or open", "status")
        records = [s for s in records if s.status == status]
    return _list(
        sandbox,
        records,
        params,
        "/v1/checkout/sessions",
        lambda s: _render_session(sandbox, s, expand, "data."),
    )


@bp.get("/checkout/sessions/<session_id>")
@stripe_view
def retrieve_checkout_session(sandbox: Sandbox, params: dict, call: Call, session_id: str) -> dict:
    reject_unknown(params, ("expand",))
    expand = _expand(params, SESSION_EXPANDS)
    return _render_session(sandbox, sandbox.get_session(session_id), expand)


@bp.post("/checkout/sessions/<session_id>/expire")
@stripe_view
def expire_checkout_session(sandbox: Sandbox, params: dict, call: Call, session_id: str) -> dict:
    reject_unknown(params, ("expand",))
    expand = _expand(params, SESSION_EXPANDS)
    return _render_session(sandbox, sandbox.expire_session(session_id, call.ref), expand)


# ---------------------------------------------------------------------------------------
# Payment Intents


@bp.get("/payment_intents/<pi_id>")
@stripe_view
def retrieve_payment_intent(sandbox: Sandbox, params: dict, call: Call, pi_id: str) -> dict:
    reject_unknown(params, ("expand", "client_secret"))
    return _render_intent(sandbox, sandbox.get_payment_intent(pi_id), _expand(params, {"latest_charge"}))


def _render_intent(sandbox: Sandbox, intent, expand: set[str]) -> dict:
    body = render_payment_intent(intent)
    if "latest_charge" in expand and intent.latest_charge in sandbox.charges:
        body["latest_charge"] = render_charge(sandbox.charges[intent.latest_charge])
    return body


CANCELLATION_REASONS = ("abandoned", "duplicate", "fraudulent", "requested_by_customer")


@bp.post("/payment_intents/<pi_id>/capture")
@stripe_view
def capture_payment_intent(sandbox: Sandbox, params: dict, call: Call, pi_id: str) -> dict:
    reject_unknown(params, ("amount_to_capture", "expand"))
    expand = _expand(params, {"latest_charge"})
    amount = read_int(params.get("amount_to_capture"), "amount_to_capture", minimum=1)
    return _render_intent(sandbox, sandbox.capture_payment_intent(pi_id, amount, call.ref), expand)


@bp.post("/payment_intents/<pi_id>/cancel")
@stripe_view
def cancel_payment_intent(sandbox: Sandbox, params: dict, call: Call, pi_id: str) -> dict:
    reject_unknown(params, ("cancellation_reason", "expand"))
    expand = _expand(params, {"latest_charge"})
    reason = read_str(params.get("cancellation_reason"), "cancellation_reason")
    if reason is not None and reason not in CANCELLATION_REASONS:
        raise invalid(
            f"Invalid cancellation_reason: must be one of {', '.join(CANCELLATION_REASONS)}",
            "cancellation_reason",
        )
    return _render_intent(sandbox, sandbox.cancel_payment_intent(pi_id, reason, call.ref), expand)


# ---------------------------------------------------------------------------------------
# Refunds


@bp.post("/refunds")
@stripe_view
def create_refund(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(
        params,
        ("payment_intent", "charge", "amount", "reason", "metadata", "expand",
         "instructions_email", "refund_application_fee", "reverse_transfer"),
    )  # fmt: skip
    _expand(params, set())
    payment_intent = read_str(params.get("payment_intent"), "payment_intent")
    charge = read_str(params.get("charge"), "charge")
    if payment_intent is None and charge is None:
        raise invalid("One of `charge` or `payment_intent` is required.", None, "parameter_missing")
    reason = read_str(params.get("reason"), "reason")
    if reason is not None and reason not in REFUND_REASONS:
        raise invalid(
            "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer",
            "reason",
        )
    refund = sandbox.create_refund(
        payment_intent_id=payment_intent,
        charge_id=charge,
        amount=read_int(params.get("amount"), "amount", minimum=1),
        reason=reason,
        metadata=read_metadata(params.get("metadata")),
    )
    return render_refund(refund)


@bp.get("/refunds")
@stripe_view
def list_refunds(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, (*LIST_PARAMS, "payment_intent", "charge"))
    _expand(params, set())
    records = list(sandbox.refunds.values())
    payment_intent = read_str(params.get("payment_intent"), "payment_intent")
    if payment_intent is not None:
        records = [r for r in records if r.payment_intent_id == payment_intent]
    charge = read_str(params.get("charge"), "charge")
    if charge is not None:
        records = [r for r in records if r.charge_id == charge]
    return _list(sandbox, records, params, "/v1/refunds", render_refund)


@bp.get("/refunds/<refund_id>")
@stripe_view
def retrieve_refund(sandbox: Sandbox, params: dict, call: Call, refund_id: str) -> dict:
    reject_unknown(params, ("expand",))
    _expand(params, set())
    return render_refund(sandbox.get_refund(refund_id))


# ---------------------------------------------------------------------------------------
# Webhook endpoints


def _read_enabled_events(value: Any, *, required: bool) -> list[str] | None:
    events = read_list(value, "enabled_events")
    if not events:
        if required:
            raise missing_param("enabled_events")
        if events is None:
            return None
        raise invalid("enabled_events must not be empty.", "enabled_events")
    result = []
    for index, event_type in enumerate(events):
        if not isinstance(event_type, str) or not (event_type == "*" or _EVENT_TYPE.match(event_type)):
            raise invalid(
                f"Invalid {param_name('enabled_events', index)}: must be '*' or an event type",
                param_name("enabled_events", index),
            )
        if event_type not in result:
            result.append(event_type)
    return result


@bp.post("/webhook_endpoints")
@stripe_view
def create_webhook_endpoint(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, ("url", "enabled_events", "description", "metadata", "api_version", "connect", "expand"))
    _expand(params, set())
    endpoint = sandbox.create_endpoint(
        url=_read_url(params.get("url"), "url", required=True),
        enabled_events=_read_enabled_events(params.get("enabled_events"), required=True),
        description=read_str(params.get("description"), "description", max_length=5000),
        metadata=read_metadata(params.get("metadata")),
        api_version=_read_api_version(params.get("api_version"), sandbox.account),
    )
    # The signing secret is shown once, in the creation response, as at Stripe.
    return render_webhook_endpoint(endpoint, with_secret=True)


def _read_api_version(value: Any, account: Account) -> str:
    """The version the endpoint's events are rendered in: the one asked for, else the account's."""
    version = read_str(value, "api_version")
    if version is None:
        return account.default_api_version
    if not is_api_version(version):
        raise invalid(f"Invalid API version: {version}", "api_version")
    return version


@bp.get("/webhook_endpoints")
@stripe_view
def list_webhook_endpoints(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, LIST_PARAMS)
    _expand(params, set())
    return _list(
        sandbox, list(sandbox.endpoints.values()), params, "/v1/webhook_endpoints",
        render_webhook_endpoint,
    )  # fmt: skip


@bp.get("/webhook_endpoints/<endpoint_id>")
@stripe_view
def retrieve_webhook_endpoint(sandbox: Sandbox, params: dict, call: Call, endpoint_id: str) -> dict:
    reject_unknown(params, ("expand",))
    _expand(params, set())
    return render_webhook_endpoint(sandbox.get_endpoint(endpoint_id))


@bp.post("/webhook_endpoints/<endpoint_id>")
@stripe_view
def update_webhook_endpoint(sandbox: Sandbox, params: dict, call: Call, endpoint_id: str) -> dict:
    reject_unknown(params, ("url", "enabled_events", "description", "disabled", "metadata", "expand"))
    _expand(params, set())
    endpoint = sandbox.get_endpoint(endpoint_id)
    url = _read_url(params.get("url"), "url")
    events = _read_enabled_events(params.get("enabled_events"), required=False)
    disabled = read_bool(params.get("disabled"), "disabled")
    metadata = merge_metadata(endpoint.metadata, params["metadata"]) if "metadata" in params else None
    if url is not None:
        endpoint.url = url
    if events is not None:
        endpoint.enabled_events = events
    if "description" in params:
        endpoint.description = read_str(params.get("description"), "description", max_length=5000)
    if disabled is not None:
        endpoint.status = "disabled" if disabled else "enabled"
    if metadata is not None:
        endpoint.metadata = metadata
    return render_webhook_endpoint(endpoint)


@bp.delete("/webhook_endpoints/<endpoint_id>")
@stripe_view
def delete_webhook_endpoint(sandbox: Sandbox, params: dict, call: Call, endpoint_id: str) -> dict:
    reject_unknown(params, ())
    endpoint = sandbox.delete_endpoint(endpoint_id)
    return {"id": endpoint.id, "object": "webhook_endpoint", "deleted": True}


# ---------------------------------------------------------------------------------------
# Events


@bp.get("/events")
@stripe_view
def list_events(sandbox: Sandbox, params: dict, call: Call) -> dict:
    reject_unknown(params, (*LIST_PARAMS, "type", "types", "delivery_success"))
    _expand(params, set())
    records = list(sandbox.events.values())
    event_type = read_str(params.get("type"), "type")
    types = read_list(params.get("types"), "types")
    if event_type is not None and types:
        raise invalid("You cannot specify both `type` and `types`.", "types")
    patterns = [event_type] if event_type is not None else list(types or [])
    if patterns:
        records = [e for e in records if any(_type_matches(p, e.type) for p in patterns)]
    delivery_success = read_bool(params.get("delivery_success"), "delivery_success")
    if delivery_success is not None:
        records = [
            e
            for e in records
            if e.deliveries
            and all(d.status == "succeeded" for d in e.deliveries if not d.duplicate) == delivery_success
        ]
    return _list(sandbox, records, params, "/v1/events", render_event)


def _type_matches(pattern: str, event_type: str) -> bool:
    """Stripe allows one trailing wildcard: `checkout.session.*`."""
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


@bp.get("/events/<event_id>")
@stripe_view
def retrieve_event(sandbox: Sandbox, params: dict, call: Call, event_id: str) -> dict:
    reject_unknown(params, ("expand",))
    _expand(params, set())
    return render_event(sandbox.get_event(event_id))
