"""What every page check of the browser tests asks, in one place: axe's serious findings and, on a
phone, whether the page fits its screen; and an operator's login through the console's form."""

from __future__ import annotations

from browser.test_console_phone import OVERFLOW
from browser.test_storefront_pages import WIDTHS, axe_problems

OPERATOR = ("ops@example.com", "correct horse battery")


def sized_page(new_page, width: str):
    """A fresh profile's page (the `new_page` fixture) at `width`, a key of WIDTHS: a phone's is a
    phone's (is_mobile), and a CSS pixel is a screen pixel on both."""
    return new_page(viewport=WIDTHS[width], is_mobile=width == "phone", device_scale_factor=1)


def page_problems(page, phone_width: int | None = None) -> list[str]:
    """axe's serious findings on the loaded page; with `phone_width`, also a page wider than the
    screen, elements off it, and text squeezed to a letter a line."""
    page.wait_for_load_state()
    problems = axe_problems(page)
    if phone_width is not None:
        layout = page.evaluate(OVERFLOW, phone_width)
        scroll_width, client_width = layout["doc"]
        if scroll_width > client_width:
            problems.append(f"page {scroll_width} px wide on a {client_width} px screen")
        problems += [f"off screen: {o}" for o in layout["out"][:5]]
        problems += [f"letter-by-letter: {n}" for n in layout["narrow"][:5]]
    return problems


def log_in_operator(page, base_url: str, email: str = OPERATOR[0], password: str = OPERATOR[1]) -> None:
    """The console's login form, filled and sent; returns on the dashboard."""
    page.goto(f"{base_url}/console/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")
