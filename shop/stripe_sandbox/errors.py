"""Stripe-shaped API errors.

Every refusal the sandbox makes travels as a `StripeError` and is rendered as Stripe renders
it: `{"error": {"type", "code", "message", "param"}}` with the matching HTTP status, so the
real SDK raises the same exception class it would raise against Stripe. Like Stripe, an error
with no code or no parameter to blame leaves that key out rather than sending it as null.
"""

from __future__ import annotations


class StripeError(Exception):
    """An API refusal with Stripe's error fields.

    `saved` says whether an Idempotency-Key stores this result for replay. Stripe saves the
    result of a request that began executing (a refusal about the state of money, such as an
    over-refund) but not one that failed parameter validation, so a corrected retry with the
    same key still works.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        saved: bool = True,
        extra: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.saved = saved
        self.extra = extra or {}

    def body(self, request_log_url: str | None = None) -> dict:
        error = {"type": self.type}
        if self.code is not None:
            error["code"] = self.code
        error["message"] = self.message
        if self.param is not None:
            error["param"] = self.param
        if request_log_url:
            error["request_log_url"] = request_log_url
        error.update(self.extra)
        return {"error": error}


def invalid(message: str, param: str | None = None, code: str | None = None) -> StripeError:
    """A parameter that failed validation (400, not saved for idempotent replay)."""
    return StripeError(400, message, param=param, code=code, saved=False)


def missing_param(param: str) -> StripeError:
    return StripeError(
        400,
        f"Missing required param: {param}.",
        param=param,
        code="parameter_missing",
        saved=False,
    )


def unknown_param(param: str) -> StripeError:
    return StripeError(
        400,
        f"Received unknown parameter: {param}",
        param=param,
        code="parameter_unknown",
        saved=False,
    )


def no_such(kind: str, object_id: str, param: str | None = "id", status: int = 404) -> StripeError:
    """An unknown id: 404 when it is the URL's object, 400 when a param refers to it."""
    return StripeError(
        status,
        f"No such {kind}: '{object_id}'",
        param=param,
        code="resource_missing",
        saved=False,
    )


def state_conflict(message: str, param: str | None = None, code: str | None = None) -> StripeError:
    """A refusal about the current state of an object (400, saved for replay)."""
    return StripeError(400, message, param=param, code=code, saved=True)
