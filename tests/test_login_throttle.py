"""Guessing passwords is throttled per (username, address), and per address for spraying.

Ten failed sign-ins of one username from one address lock that username out from
that address only: other people behind the same address (an office NAT) still sign
in, and the user still signs in from elsewhere. A hundred failures from one address,
whatever the usernames, lock the address out for everyone. A lockout lasts 15
minutes, refuses the right password too, and the sign-in page says what is locked
and until when. Signing in clears the failures of its own username and address.
"""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db.models import F

from deployhub.teams.models import Event, Role, SignInFailures
from tests.conftest import PASSWORD, ROOT

DIDNT_MATCH = "didn't match"


def sign_in(client, username, password, address="10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def fail(client, username, times, address="10.0.0.1"):
    """Sign in with a wrong password `times` times; return the answers' status codes."""
    return [sign_in(client, username, f"guess {n}", address).status_code for n in range(times)]


def time_passes(**delta):
    """Move every counted failure and lockout that much (timedelta's arguments) into the past."""
    shift = timedelta(**delta)
    SignInFailures.objects.update(
        window_started_at=F("window_started_at") - shift, locked_until=F("locked_until") - shift
    )


def locked_until(username, address):
    """The lockout's end as the sign-in page words it, e.g. 14:32 UTC."""
    row = SignInFailures.objects.get(username=username, address=address)
    return f"{row.locked_until:%H:%M} UTC"


def signed_in_as(client):
    return client.session.get("_auth_user_id")


def test_it_keeps_everyone_else_at_an_address_signing_in_when_a_made_up_username_fails(
    client, alice, bob
):
    """The shared office NAT: one person's typos lock nobody else out."""
    assert fail(client, "nobody", 12) == [200] * 9 + [429] * 3

    assert sign_in(client, "bob", PASSWORD).status_code == 302
    assert signed_in_as(client) == str(bob.pk)


def test_it_keeps_alice_signing_in_from_her_own_address_while_another_guesses_her_password(
    client, alice
):
    assert fail(client, "alice", 10, address="10.0.1.1") == [200] * 9 + [429]

    assert sign_in(client, "alice", PASSWORD, address="10.0.1.2").status_code == 302
    assert signed_in_as(client) == str(alice.pk)


def test_it_forgets_the_failures_of_a_username_and_address_when_the_user_signs_in(client, alice):
    assert fail(client, "alice", 9) == [200] * 9
    assert sign_in(client, "alice", PASSWORD).status_code == 302
    client.post("/logout/")

    assert fail(client, "alice", 9) == [200] * 9
    assert sign_in(client, "alice", PASSWORD).status_code == 302


def test_it_locks_a_username_at_an_address_out_and_lets_it_in_after_the_lockout(client, alice):
    answers = [sign_in(client, "alice", f"guess {n}") for n in range(50)]

    assert [a.status_code for a in answers[:9]] == [200] * 9
    assert DIDNT_MATCH in answers[0].content.decode()
    assert {a.status_code for a in answers[9:]} == {429}
    assert int(answers[-1]["Retry-After"]) > 14 * 60

    refused = sign_in(client, "alice", PASSWORD)
    assert refused.status_code == 429 and signed_in_as(client) is None

    # Refused attempts counted nothing and extended nothing: 16 minutes on, she is in.
    time_passes(minutes=16)
    assert sign_in(client, "alice", PASSWORD).status_code == 302
    assert signed_in_as(client) == str(alice.pk)


def test_it_says_which_username_and_address_are_locked_and_until_when(client, alice):
    fail(client, "alice", 10, address="10.0.2.1")

    answer = sign_in(client, "alice", PASSWORD, address="10.0.2.1")

    assert answer.status_code == 429
    assert (
        "Too many failed sign-ins as alice from your address (10.0.2.1): alice cannot sign in "
        f"from it until {locked_until('alice', '10.0.2.1')} (try again in 15 minutes). "
        "Other users at this address are not affected."
    ) in answer.content.decode()


@pytest.fixture
def address_limit(settings):
    """A spraying limit of 25 failures per address, well above the pair's 10."""
    settings.DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT = 25
    return 25


def test_it_locks_an_address_out_that_tries_many_usernames(client, alice, address_limit):
    codes = [fail(client, f"user{n}", 1, address="10.0.3.1")[0] for n in range(address_limit)]
    assert codes == [200] * (address_limit - 1) + [429]

    answer = sign_in(client, "alice", PASSWORD, address="10.0.3.1")
    assert answer.status_code == 429
    assert (
        "Too many failed sign-ins from your address (10.0.3.1), whatever the username: "
        f"nobody can sign in from it until {locked_until('', '10.0.3.1')} "
        "(try again in 15 minutes)."
    ) in answer.content.decode()
    assert sign_in(client, "alice", PASSWORD, address="10.0.3.2").status_code == 302


def test_it_keeps_counting_an_address_whose_user_signs_in(client, alice, address_limit):
    """A sprayer with an account of its own cannot clear its address's count by signing in."""
    for n in range(address_limit - 1):
        fail(client, f"user{n}", 1, address="10.0.4.1")
    assert sign_in(client, "alice", PASSWORD, address="10.0.4.1").status_code == 302
    client.post("/logout/")

    assert fail(client, "user99", 1, address="10.0.4.1") == [429]


def test_it_counts_failures_over_the_window_from_the_first(client, alice):
    fail(client, "alice", 9)
    time_passes(minutes=16)

    assert fail(client, "alice", 9) == [200] * 9


def test_it_counts_failures_on_the_admin_sign_in_page_too(client, alice):
    for _ in range(10):
        client.post("/admin/login/", {"username": "alice", "password": "x"}, REMOTE_ADDR="10.0.5.1")

    assert sign_in(client, "alice", PASSWORD, address="10.0.5.1").status_code == 429
    assert sign_in(client, "alice", PASSWORD, address="10.0.5.2").status_code == 302


def test_it_records_one_lockout_event_in_each_team_of_the_user(client, alice, charlie):
    alice.memberships.create(team=charlie.memberships.get().team, role=Role.VIEWER)

    fail(client, "alice", 25, address="10.0.6.1")

    events = Event.objects.filter(verb="user.locked_out")
    assert sorted(e.team.slug for e in events) == ["acme", "demo"]
    event = events.first()
    assert event.target_type == "user" and event.target_id == alice.pk
    assert event.actor == "system"
    assert event.data == {"user": "alice", "address": "10.0.6.1", "failures": 10, "minutes": 15}


def test_it_records_no_event_for_a_username_nobody_has(client, alice):
    fail(client, "nobody", 12)

    assert not Event.objects.filter(verb="user.locked_out").exists()
    assert sign_in(client, "nobody", "wrong").status_code == 429


def test_it_takes_the_limits_the_window_and_the_lockout_from_the_environment(tmp_path):
    login = {
        "DEPLOYHUB_LOGIN_FAILURE_LIMIT": "3",
        "DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT": "40",
        "DEPLOYHUB_LOGIN_WINDOW_MINUTES": "5",
        "DEPLOYHUB_LOGIN_LOCKOUT_MINUTES": "2",
    }
    env = {**os.environ, "DEPLOYHUB_VAR_DIR": str(tmp_path), **login}
    code = f"import deployhub.settings as s; print({', '.join('s.' + n for n in login)})"

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert result.stdout.split() == list(login.values()), result.stderr


@pytest.mark.parametrize("address", ["10.0.7.1", "2001:db8::1"])
def test_it_says_when_an_address_may_try_again_in_minutes_rounded_up(client, alice, address):
    fail(client, "alice", 10, address=address)
    time_passes(minutes=14, seconds=1)

    answer = sign_in(client, "alice", PASSWORD, address=address)

    assert "(try again in 1 minute)." in answer.content.decode()
    assert 0 < int(answer["Retry-After"]) <= 60
