"""Storefront routes (docs/REFERENCE.md, Storefront): checkout, the order pages, paying and
cancelling, and the return from the payment page. The catalog and the cart are in cart.py."""

from __future__ import annotations

import hmac
import json
from functools import wraps
from typing import TypeGuard

from flask import flash, jsonify, redirect, request, url_for
from sqlalchemy import select

from ..domain.order import LIVE, OrderStatus
from ..errors import OrderNotFound
from ..extensions import db
from ..models import Cart, CartState, Order
from ..orders.cancel import CancelStatus, cancel_order
from ..orders.checkout import CheckoutRefused, Refusal
from ..orders.lookup import just_ordered_by
from ..orders.release import place_order_releasing
from ..payments.apply import Outcome, ask_and_apply
from ..payments.checkout_queue import expected_wait_seconds, place_in_line
from ..payments.holds import is_held
from ..payments.start import StartCode, StartOutcome, StartStatus, joined_line, line_is_held, start_payment
from ..provider import gateway
from ..store import order_store
from ..web.answers import answer_if_later_fails, at_address, browser_id, respond, wants_json
from ..web.idempotency import idempotent
from ..web.serialize import OrderView, PaymentStatus, summary_json
from ..web.words import cancel_conflict_words
from .blueprint import bp
from .cart import render_cart
from .cart_words import EMPTY_CART, JUST_ORDERED, checkout_refusal_words
from .email_typos import typo_hint
from .forms import ActionForm, CancelForm, CheckoutForm, first_error
from .order_links import unpaid_limit
from .payment_words import cancel_refusal_words, start_words

# A cart that conflicts with the stock, with itself, or with the customer's other orders: 409.
# Everything else the customer must change in the request (the email, an empty cart) is a 400.
_REFUSAL_STATUS = {
    Refusal.OUT_OF_STOCK: 409,
    Refusal.CART_CLOSED: 409,
    Refusal.TOO_MANY_OF_ONE: 409,
    Refusal.TOO_MANY_UNPAID: 409,
}


@bp.post("/checkout")
@idempotent
def checkout():
    """Place the order from the cart, then send the customer to the hosted payment page."""
    form = CheckoutForm()
    if not form.validate():
        return render_cart(
            400,
            first_error(form),
            form=form,
            field="email" if form.email.errors and "csrf_token" not in form.errors else None,
        )
    hint = typo_hint(form)  # "did you mean ...@gmail.com?": asked once, before anything is placed
    if hint is not None:
        return hint
    # The cart's id only: place_order reads the lines itself and refuses an empty cart.
    bid = browser_id(create=False)
    cart_id = (
        None
        if bid is None
        else db.session.execute(
            select(Cart.id)
            .where(Cart.browser_id == bid, Cart.status == CartState.OPEN)
            .order_by(Cart.id.desc())
            .limit(1)
        ).scalar()
    )
    if cart_id is None or bid is None:  # no browser id, no cart
        return _just_ordered(bid, form) or render_cart(400, EMPTY_CART, form=form, field="empty")
    in_line = line_is_held()  # the provider's budget for new sessions is spent: join the line at once
    email = (form.email.data or "").strip()  # the form validated: DataRequired
    result = place_order_releasing(
        cart_id=cart_id, browser_id=bid, email=email, in_line=in_line, client_address=request.remote_addr
    )
    if isinstance(result, CheckoutRefused):  # not result.ok
        if result.code is Refusal.CART_CLOSED:
            # The other submit of this cart won: say where its order is (if it was this browser's).
            answer = _just_ordered(bid, form)
            if answer is not None:
                return answer
        status = _REFUSAL_STATUS.get(result.code, 400)
        detail = checkout_refusal_words(result, email)
        field = {Refusal.OUT_OF_STOCK: "stock", Refusal.UNAVAILABLE: "stock", Refusal.EMPTY_CART: "empty"}.get(
            result.code
        )
        unpaid = unpaid_limit(result, email)
        field = "unpaid" if unpaid else field  # the cart page says it with its link or button
        return render_cart(status, detail, result.shortages, form=form, field=field, over=result.over, unpaid=unpaid)
    order_url = url_for("storefront.order_page", reference=result.reference)
    # The order is placed and this browser owns it: whatever fails from here (the database lost
    # under the payment's start), the customer is sent to the order, which offers "Pay now".
    answer_if_later_fails(lambda: _placed_but_payment_not_started(result.reference, order_url))
    if in_line:
        joined_line(result.order_id)
        started = StartOutcome(StartCode.IN_LINE)
    else:
        started = start_payment(result.order_id, placed=result)
    # docs/REFERENCE.md, Storefront: success is a 303 whatever the client accepts; a JSON client also gets
    # the same facts in the body, so it need not follow the redirect to learn them.
    if started.status is StartStatus.STARTED:
        assert started.url is not None, "a started payment has its page"
        return _see_other(
            started.url, {"reference": result.reference, "payment_url": started.url, "order_url": order_url}
        )
    if started.status is StartStatus.QUEUED:  # the order page says it and moves on by itself: no flash
        return _see_other(
            order_url,
            {
                "reference": result.reference,
                "payment_url": None,
                "order_url": order_url,
                "queued": True,
                "message": start_words(started),
            },
        )
    if not wants_json():  # a JSON client reads the message in the body; a flash would wait for its next page
        flash(start_words(started), "warning")
    return _see_other(
        order_url,
        {"reference": result.reference, "payment_url": None, "order_url": order_url, "message": start_words(started)},
    )


def _just_ordered(bid: str | None, form):
    """The answer to a checkout of a cart this browser has just turned into an order (a double
    submit: the other request placed it): 409 with the order's reference and its page, which this
    browser owns, instead of only "Your cart is empty"; None when there is no such order."""
    order = just_ordered_by(bid)
    if order is None:
        return None
    url = url_for("storefront.order_page", reference=order.reference)
    return render_cart(
        409, JUST_ORDERED.format(reference=order.reference), form=form, field="ordered", ordered=(order.reference, url)
    )


def _placed_but_payment_not_started(reference: str, order_url: str):
    message = (
        f"Your order {reference} is placed and its items are held for you, but the payment could not be "
        "started just now. Open the order and use “Pay now” in a moment."
    )
    if not wants_json():
        flash(message, "warning")
    return _see_other(
        order_url, {"reference": reference, "payment_url": None, "order_url": order_url, "message": message}
    )


def _see_other(location: str, data: dict):
    response = redirect(location, 303)
    if wants_json():
        response.set_data(json.dumps(data))
        response.mimetype = "application/json"
    return response


def _owned_order(reference: str) -> Order:
    """The order, if this browser placed it or the request carries its access token; else 404
    (not 403: another browser must not even learn that the reference exists)."""
    order = order_store.by_reference(reference, details=True)
    if order is None:
        raise OrderNotFound()
    token = request.values.get("token") or ""
    if order.browser_id == browser_id(create=False):
        return order
    # Bytes: compare_digest refuses str with non-ASCII characters, and the token is the sender's text.
    if token and hmac.compare_digest(token.encode(), order.access_token.encode()):
        return order
    raise OrderNotFound()


@bp.get("/orders")
def orders():
    """This browser's orders, newest first."""
    bid = browser_id(create=False)
    if wants_json():  # the summaries alone, read as such
        rows = [] if bid is None else order_store.summaries_of_browser(bid)
        return respond("storefront/orders.html", {"orders": [summary_json(row) for row in rows]})
    views = [] if bid is None else [OrderView.of(row) for row in order_store.of_browser(bid)]
    # The same badge as each order's own page says (a settling payment, an expired order).
    return respond("storefront/orders.html", {"orders": [dict(summary_json(v), badge=v.badge) for v in views]})


@bp.get("/orders/<reference>")
def order_page(reference: str):
    """One order's status, lines, payment and refunds. `?continue=1` (what the page of an order in
    line reloads to when the browser runs no script) goes on to the hosted payment page once the
    order has one."""
    view = OrderView.of(_owned_order(reference))
    if (
        request.args.get("continue")
        and view.status is OrderStatus.PAYMENT_INITIATED
        and view.payment_session_url
        and view.payment_status is not PaymentStatus.PROCESSING
    ):
        return redirect(view.payment_session_url, 303)
    return _render_order(view)


def _render_order(view: OrderView, status: int = 200, error: str | None = None):
    """The order page (JSON: the order's, with why and when it was cancelled for a cancelled one,
    and its place in line for one waiting for its payment page: `line`, orders ahead and the wait
    the provider's budget implies)."""
    data = view.shown_json()
    if view.in_line:
        ahead = place_in_line(view)
        assert ahead is not None, "an order in line has a place in it"
        data["line"] = {"ahead": ahead, "wait_seconds": round(expected_wait_seconds(ahead), 1)}
    if error:
        data["error"] = error
    token = request.values.get("token")
    address = url_for("storefront.order_page", reference=view.reference, token=token or None)
    response = respond(
        "storefront/order.html",
        data,
        status,
        order=view,
        token=token,
        badge=view.badge,
        watch_state=view.watch_state if view.keeps_changing else None,
        address=address,
    )
    return at_address(response, address)


def _order_action(form_class):
    """A POST the order's owner makes with a `form_class` form: the view gets the URL's reference,
    the order and the form, or the order's page answers 400 with the form's first error."""

    def wrap(view):
        @wraps(view)
        def action(reference: str):
            order = _owned_order(reference)
            form = form_class()
            if not form.validate():
                return _render_order(OrderView.of(order), 400, first_error(form))
            return view(reference, order, form)

        return action

    return wrap


@bp.post("/orders/<reference>/pay")
@idempotent
@_order_action(ActionForm)
def pay(reference: str, order: Order, form: ActionForm):
    """Start or retry payment (PendingPayment / PaymentFailed)."""
    started = start_payment(order.id)
    if started.status is StartStatus.STARTED:
        assert started.url is not None, "a started payment has its page"
        if wants_json():
            return {"reference": reference, "payment_url": started.url}, 200
        return redirect(started.url, 303)
    if started.status is StartStatus.QUEUED:
        if wants_json():
            return {"reference": reference, "payment_url": None, "queued": True, "message": start_words(started)}, 202
        return redirect(
            url_for("storefront.order_page", reference=reference, token=request.values.get("token") or None), 303
        )
    order = _reread(order)
    status = 503 if started.status is StartStatus.UNAVAILABLE else 409
    # The page itself shows the message (no flash too: it would show twice, and again later).
    return _render_order(OrderView.of(order), status, start_words(started))


@bp.get("/orders/<reference>/cancel")
def confirm_cancel(reference: str):
    """Are you sure? The order page's Cancel button leads here and this page's form makes the
    POST, so a stray click cancels nothing (a script posts to the same URL directly). `version`
    is the one the order page showed: if the order changed since, the POST says so (409)."""
    order = _owned_order(reference)
    token = request.args.get("token") or None
    held = order.status is OrderStatus.AUTHORIZED and order.capture_requested_at is None  # until it ships
    if order.status not in LIVE and not held:
        return redirect(url_for("storefront.order_page", reference=order.reference, token=token), 303)
    version = request.args.get("version", type=int)
    view = OrderView.of(order)
    return respond(
        "storefront/cancel.html",
        view.json(),
        token=token,
        version=version if version is not None else view.version,
    )


@bp.post("/orders/<reference>/cancel")
@idempotent
@_order_action(CancelForm)
def cancel(reference: str, order: Order, form: CancelForm):
    """Cancel with the version the customer saw; a stale version gets 409 and the current state."""
    outcome = cancel_order(order.id, form.version.data)
    # `order` is the mapped row: a cancel that rolled back (or saved) expired it, so it reads the
    # order as it is now.
    if outcome.status is CancelStatus.CANCELLED:
        # The stock comes back through the compensation, after this commit: say so, not that it is back.
        done = "Your order is cancelled and nothing was charged. Its items go back on sale in a moment."
        page = url_for("storefront.order_page", reference=reference, token=request.values.get("token") or None)
        answer_if_later_fails(lambda: _cancelled_answer(reference, page, done))
        if wants_json():
            return _render_order(OrderView.of(_reread(order)))
        flash(done)
        return redirect(page, 303)
    message = (
        cancel_conflict_words(outcome)
        if outcome.status is CancelStatus.CONFLICT
        else cancel_refusal_words(outcome.code, outcome.message)
    )
    return _render_order(OrderView.of(order), 409, message)


def _cancelled_answer(reference: str, page: str, done: str):
    """The cancel committed but the order could not be read back to show it."""
    if wants_json():
        return jsonify({"reference": reference, "status": OrderStatus.CANCELLED, "message": done}), 200
    flash(done)
    return redirect(page, 303)


# Compared against when there is no order, or it has no payment session: an unknown reference
# takes the same steps as a wrong session id. No session id the provider makes looks like it.
_NO_SESSION = b"\x00no-session"


def _reread(order: Order) -> Order:
    """The order as it is now, after a use case that committed or rolled back."""
    now = db.session.get(Order, order.id)
    assert now is not None, "the shop deletes no order"
    return now


def _is_own_session(order: Order | None, session_id: str) -> TypeGuard[Order]:
    """Whether `session_id` is the order's own current payment session (orders.payment_session_id),
    compared in constant time; False for no order or no recorded session, after the same compare."""
    recorded = order.payment_session_id if order is not None else None
    same = hmac.compare_digest(session_id.encode(), recorded.encode() if recorded else _NO_SESSION)
    return same and bool(recorded)


@bp.get("/checkout/return")
def checkout_return():
    """Stripe's success URL: ask the provider now and apply the same guarded transition as the
    webhook, so a paid customer sees "Paid" even when the webhook is late or lost.

    The link is anonymous and its text the visitor's: the provider is asked only about the
    session the order itself recorded. Any other session id and an unknown reference are the same
    404 after the same one read, with no provider call, so neither the shop's provider budget nor
    the answer's timing is the visitor's to spend or read (and the throttle bounds the rest)."""
    reference = request.args.get("order", "")
    session_id = request.args.get("session_id", "")
    order = order_store.by_reference(reference)
    if not _is_own_session(order, session_id):
        raise OrderNotFound()
    owner = order.browser_id == browser_id(create=False)
    # Paid by this session already (the webhook came first): the provider has nothing to add. A
    # cancelled order still asks: money that arrived after the cancel is late money to refund.
    if order.status != OrderStatus.PAID:
        _confirm_with_the_provider(order, session_id)
    if owner:
        return redirect(url_for("storefront.order_page", reference=reference), 303)
    return redirect(url_for("storefront.order_page", reference=reference, token=order.access_token), 303)


def _confirm_with_the_provider(order: Order, session_id: str) -> None:
    """Ask the provider about the order's own session and apply its answer as the webhook would;
    flash what the customer should know. 404 when the provider says it is not this order's."""
    try:
        answer = ask_and_apply(session_id, source="return", for_order=order.id)
    except gateway.ProviderRefused:
        raise OrderNotFound() from None
    except gateway.ProviderUnavailable:
        answer = None
    if answer is not None and answer.applied is None:  # the provider says it is another order's session
        raise OrderNotFound()
    view = answer.view if answer is not None else None
    if view is None:
        flash("We could not confirm your payment with the provider yet; this page will update once it does.", "warning")
        return
    assert answer is not None and answer.applied is not None, "the view came with an answer, checked above"
    if (
        view.payment_status != gateway.SessionPaymentStatus.PAID
        and view.status == gateway.SessionStatus.COMPLETE
        and answer.applied.outcome != Outcome.PAYMENT_FAILED
        and not is_held(view)  # held until it ships: the order page says so
    ):
        flash("Your payment is being processed; we will email you when it completes.")
