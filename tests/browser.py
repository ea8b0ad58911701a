"""Signing in from a browser test, the way every end-to-end test does it."""

from tests.conftest import PASSWORD


def sign_in(page, live_server, username, password=PASSWORD):
    """Sign in on the page and wait until the hub has answered with the next page.

    A `page.goto` straight after the click can cancel the sign-in's POST before its
    session cookie arrives; the next page then shows the sign-in form again, which a
    test sees as a missing button under a loaded machine.
    """
    page.context.clear_cookies()
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)
    return page
