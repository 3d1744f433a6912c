"""What an operator is told about a remedy for a failed refund: the use cases (payments.refund_remedies)
say what happened as codes and facts, this says it in words (the console's JSON "message" or
"detail", and its flash)."""

from __future__ import annotations

from ..payments.refund_remedies import ActionOutcome, NotNow, RefundAction, Remedy


def refund_action_words(action: RefundAction) -> str:
    """The sentence for what a retry or a settle did, or why it did not."""
    rid, facts = action.refund_id, action.refund or {}
    if action.outcome is ActionOutcome.MISSING:
        return f"There is no refund {rid}."
    if action.outcome is ActionOutcome.REFUSED:
        return _why_not(action, facts)
    if action.remedy is Remedy.RETRY:
        if action.outcome is ActionOutcome.ALREADY:
            return (
                f"Refund {rid} was already sent again (attempt {facts['attempts']}, "
                f"now {facts['status']}); nothing more was done."
            )
        failed = action.failed_error or f"attempt {action.seen} {action.failed_status}"  # the one sent again
        return f"Refund {rid} will be sent again now, as attempt {facts['attempts']} ({failed})."
    if action.outcome is ActionOutcome.ALREADY:
        return f"Refund {rid} was already recorded as settled outside the shop; nothing more was done."
    return f"Refund {rid} is recorded as settled outside the shop."


def _why_not(action: RefundAction, facts: dict) -> str:
    rid, why = action.refund_id, action.why
    if why is NotNow.SETTLED:
        if action.remedy is Remedy.SETTLE:
            return (
                f"Refund {rid} was already recorded as settled outside the shop by "
                f"{facts['settled_by']} ({facts['settlement_reason']})."
            )
        return f"Refund {rid} was settled outside the shop by {facts['settled_by']}; nothing to do."
    if why is NotNow.PENDING:
        return (
            f"Refund {rid} is pending at the provider (attempt {facts['attempts']}): wait for its answer; "
            "only a refund that failed can be retried or settled."
        )
    if why is NotNow.SUCCEEDED:
        return f"Refund {rid} succeeded: the money went back; nothing to do."
    return (
        f"Refund {rid} changed meanwhile: it is now at attempt {facts['attempts']}, not {action.seen}; "
        "reload and look again."
    )
