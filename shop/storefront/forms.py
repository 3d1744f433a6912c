from wtforms import HiddenField, IntegerField
from wtforms.validators import DataRequired, InputRequired, StopValidation

from ..orders.cart import most_of_one_item
from ..settings import MOST_OF_ONE_ITEM
from ..web.requests import Form, email_field


class QuantityField(IntegerField):
    """A number of items. What cannot be read as a whole number is left as no number (data None)
    rather than recorded as WTForms' own "Not a valid integer value.": LineQuantity then says the
    one sentence a customer needs, with the range the page's input allows."""

    def process_formdata(self, valuelist):
        try:
            super().process_formdata(valuelist)
        except ValueError:
            self.data = None
        self.process_errors = []
        if valuelist and self.data is None:
            self.raw_data = valuelist


class LineQuantity:
    """1 to MAX_LINE_QUANTITY, the same bound the page's quantity inputs carry in their `max`
    attribute (so the browser's own check and this one name the same number). Beyond the limit but
    within the forms' bound the cart's use case refuses instead, naming the item
    (orders.cart, TOO_MANY)."""

    def __call__(self, form, field):
        if field.data is None or not 1 <= field.data <= MOST_OF_ONE_ITEM:
            raise StopValidation(f"Choose a quantity from 1 to {most_of_one_item()}.")


class AddToCartForm(Form):
    variant_id = IntegerField("Variant", validators=[DataRequired(message="Choose an item.")])
    quantity = QuantityField("Quantity", default=1, validators=[LineQuantity()])


class QuantityForm(Form):
    """Set one cart line's quantity (the cart page's stepper)."""

    quantity = QuantityField("Quantity", validators=[LineQuantity()])


class CheckoutForm(Form):
    email = email_field("Email", DataRequired(message="Enter your email so we can send your receipt."))
    # The address the customer chose to keep over a "did you mean" (email_typos): not asked again.
    kept_email = HiddenField()


class OrderLinksForm(Form):
    """The address whose orders waiting for payment get their links emailed (order_links)."""

    email = email_field("Email", DataRequired(message="Enter the email address to send the links to."))


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
            # The shop's own sentences name what they are about ("Choose a quantity ..."): shown
            # as they are. WTForms' generic ones ("Not a valid integer value.") get the field's name.
            label = getattr(getattr(form, field, None), "label", None)
            name = label.text if label else field
            return errors[0] if name.lower() in errors[0].lower() else f"{name}: {errors[0]}"
    return "The form is not valid."
