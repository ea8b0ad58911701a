"""Guessing passwords is throttled: a username, or an address, is locked out after 10 failures.

django-axes counts failed sign-ins per username and per address; the 10th locks
that username (from anywhere) or that address (for any username) out for 15 minutes,
the right password included, with the sign-in page saying so. Each team of a
locked-out user gets one audit event.
"""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.db.models import F

from deployhub.teams.models import Event, Role
from tests.conftest import PASSWORD, ROOT

LOCKED = "Too many failed sign-ins: try again in 15 minutes."


def sign_in(client, username, password, address="10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_a_user_out_after_ten_wrong_passwords_and_lets_them_in_after_the_cool_off(
    client, alice
):
    answers = [sign_in(client, "alice", f"guess {n}") for n in range(50)]

    assert [a.status_code for a in answers[:9]] == [200] * 9
    assert "didn't match" in answers[0].content.decode()
    assert {a.status_code for a in answers[9:]} == {429}
    assert LOCKED in answers[9].content.decode()
    assert int(answers[-1]["Retry-After"]) > 14 * 60

    refused = sign_in(client, "alice", PASSWORD)
    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    assert client.session.get("_auth_user_id") is None

    # 16 minutes later: the failures are older than the cool-off.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=16))
    assert sign_in(client, "alice", PASSWORD).status_code == 302
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_it_locks_the_username_out_from_every_address(client, alice, bob):
    for n in range(10):
        sign_in(client, "alice", "wrong", address=f"10.0.1.{n}")

    assert sign_in(client, "alice", PASSWORD, address="10.9.9.9").status_code == 429
    # The addresses themselves made one failure each: bob signs in from the first.
    assert sign_in(client, "bob", PASSWORD, address="10.0.1.0").status_code == 302


def test_it_locks_an_address_out_that_guesses_many_usernames(client, alice):
    for n in range(10):
        sign_in(client, f"user{n}", "wrong", address="10.0.2.1")

    answer = sign_in(client, "alice", PASSWORD, address="10.0.2.1")
    assert answer.status_code == 429 and LOCKED in answer.content.decode()
    assert sign_in(client, "alice", PASSWORD, address="10.0.2.2").status_code == 302


def test_it_counts_failures_on_the_admin_sign_in_page_too(client, alice):
    for _ in range(10):
        client.post("/admin/login/", {"username": "alice", "password": "x"}, REMOTE_ADDR="10.0.3.1")

    assert sign_in(client, "alice", PASSWORD, address="10.0.3.2").status_code == 429


def test_it_records_one_lockout_event_in_each_team_of_the_user(client, alice, charlie):
    alice.memberships.create(team=charlie.memberships.get().team, role=Role.VIEWER)

    for _ in range(25):
        sign_in(client, "alice", "wrong", address="10.0.4.1")

    events = Event.objects.filter(verb="user.locked_out")
    assert sorted(e.team.slug for e in events) == ["acme", "demo"]
    event = events.first()
    assert event.target_type == "user" and event.target_id == alice.pk
    assert event.actor == "system"
    assert event.data == {"user": "alice", "address": "10.0.4.1", "failures": 10, "minutes": 15}


def test_it_records_no_event_for_a_username_nobody_has(client, alice):
    for _ in range(12):
        sign_in(client, "nobody", "wrong")

    assert not Event.objects.filter(verb="user.locked_out").exists()
    assert sign_in(client, "nobody", "wrong").status_code == 429


def test_it_takes_the_limit_and_the_lockout_from_the_environment(tmp_path):
    env = {
        **os.environ,
        "DEPLOYHUB_VAR_DIR": str(tmp_path),
        "DEPLOYHUB_LOGIN_FAILURE_LIMIT": "3",
        "DEPLOYHUB_LOGIN_LOCKOUT_MINUTES": "2",
    }
    code = "import deployhub.settings as s; print(s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME)"

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert result.stdout.split() == ["3", "0:02:00"], result.stderr


@pytest.mark.parametrize("address", ["10.0.5.1", "2001:db8::1"])
def test_it_says_when_an_address_may_try_again_in_minutes_rounded_up(client, alice, address):
    for _ in range(10):
        sign_in(client, "alice", "wrong", address=address)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=14, seconds=1))

    answer = sign_in(client, "alice", PASSWORD, address=address)

    assert "try again in 1 minute." in answer.content.decode()
    assert 0 < int(answer["Retry-After"]) <= 60
