from wtforms import EmailField, HiddenField, IntegerField
from wtforms.validators import DataRequired, Email, InputRequired, Length, NumberRange

from ..web.requests import Form


class AddToCartForm(Form):
    variant_id = IntegerField("Variant", validators=[DataRequired(message="Choose an item.")])
    quantity = IntegerField(
        "Quantity",
        default=1,
        validators=[
            # InputRequired, not DataRequired: a 0 is data, and deserves the range message, not "enter a quantity".
            InputRequired(message="Enter a quantity."),
            NumberRange(1, 99, message="Quantity must be between 1 and 99."),
        ],
    )


class QuantityForm(Form):
    """Set one cart line's quantity (the cart page's stepper)."""

    quantity = IntegerField(
        "Quantity",
        validators=[
            InputRequired(message="Enter a quantity."),
            NumberRange(1, 99, message="Quantity must be between 1 and 99."),
        ],
    )


class CheckoutForm(Form):
    email = EmailField(
        "Email",
        validators=[
            DataRequired(message="Enter your email so we can send your receipt."),
            Email(message="That does not look like an email address.", check_deliverability=False),
            Length(max=254),
        ],
    )


class CancelForm(Form):
    # InputRequired, not DataRequired: "abc" should read "not a valid integer", not "missing".
    version = IntegerField("Version", validators=[InputRequired(message="The order version is missing.")])
    token = HiddenField()


class ActionForm(Form):
    """A bare POST with only the CSRF token (pay, remove from cart)."""

    token = HiddenField()


def first_error(form) -> str:
    for field, errors in form.errors.items():
        if errors:
            if field == "csrf_token":
                return "Your form expired or was sent from another site; please reload the page and try again."
            label = getattr(getattr(form, field, None), "label", None)
            return f"{label.text if label else field}: {errors[0]}"
    return "The form is not valid."
