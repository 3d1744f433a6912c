from werkzeug.utils import cached_property
from wtforms import EmailField, HiddenField, PasswordField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional

from ..web.requests import Form


class ConsoleForm(Form):
    """CSRFProtect already checked the token (form field or X-CSRFToken header) for every POST
    before the view runs; checking it again here would refuse a header-only JSON client."""

    class Meta(Form.Meta):
        @cached_property  # as Flask-WTF's Meta declares it (there: WTF_CSRF_ENABLED)
        def csrf(self) -> bool:
            return False


class LoginForm(ConsoleForm):
    email = EmailField("Email", validators=[DataRequired(message="Enter your email."), Length(max=254)])
    password = PasswordField("Password", validators=[DataRequired(message="Enter your password."), Length(max=1024)])
    next = HiddenField()


class ActionForm(ConsoleForm):
    """A bare POST carrying only the CSRF token (and where to go back to)."""

    next = HiddenField()


def _reason_field(label: str, missing: str) -> TextAreaField:
    """An action's reason, the only record of the operator's decision: required (`missing` says
    what to write) and at most 2000 characters."""
    too_long = Length(max=2000, message="Keep the reason under 2000 characters.")
    return TextAreaField(label, validators=[DataRequired(message=missing), too_long])


class DiscardForm(ConsoleForm):
    reason = _reason_field(
        "Why discard it", "Say why this is discarded: the reason is the only record of the decision."
    )
    next = HiddenField()


class ResolveForm(ConsoleForm):
    # Checked in the view, so a wrong value gets words that name the two choices.
    action = StringField("Action")
    note = StringField("Note", validators=[Optional(), Length(max=2000)])
    next = HiddenField()


class RetryRefundForm(ConsoleForm):
    # The attempt the operator was looking at: the same submission sent twice retries once.
    # Read in the view with web.numbers.whole_number: IntegerField's int() takes other scripts' digits.
    attempt = StringField("Attempt")
    next = HiddenField()


class SettleRefundForm(ConsoleForm):
    reason = _reason_field(
        "How it was settled", "Say how this refund was settled outside the shop: the reason is the only record of it."
    )
    next = HiddenField()
