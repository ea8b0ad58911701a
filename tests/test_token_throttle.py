"""Guessing tokens is throttled: 30 made-up API or device tokens from one address lock it out.

For 10 minutes that address gets 429 with Retry-After and the JSON error, whatever
token it presents; other addresses, and callers with a right token elsewhere, are
not touched. A request without a token is not a guess and is not counted.
"""

import logging
from datetime import timedelta

from django.utils import timezone

from deployhub.teams.models import TokenFailures
from tests.api_calls import token_for

GUESSER = "10.0.0.66"
NEIGHBOUR = "10.0.0.67"
LOCKED = "Too many failed token authentications from this address: try again in 10 minutes."


def get(client, path, token=None, address=GUESSER):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(f"/api/v1/{path}", REMOTE_ADDR=address, **headers)


def test_it_locks_an_address_out_after_30_made_up_api_tokens(client, alice):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")

    answers = [get(client, "models", f"dhu_made-up-{n}") for n in range(50)]

    assert [a.status_code for a in answers[:30]] == [401] * 30
    assert {a.status_code for a in answers[30:]} == {429}
    assert answers[30].json() == {"error": LOCKED}
    assert 590 <= int(answers[30]["Retry-After"]) <= 600
    # The right token from the locked address is refused too: the guesser learns nothing.
    assert get(client, "models", right).status_code == 429
    assert get(client, "models", right, address=NEIGHBOUR).status_code == 200


def test_it_locks_an_address_out_after_30_made_up_device_tokens(client, make_device):
    _, right = make_device("edge-1")

    answers = [get(client, "device", f"dht_made-up-{n}") for n in range(31)]

    assert [a.status_code for a in answers[:30]] == [401] * 30
    assert answers[30].status_code == 429 and answers[30].json() == {"error": LOCKED}
    assert get(client, "device", right).status_code == 429
    assert get(client, "device", right, address=NEIGHBOUR).status_code == 200


def test_it_counts_api_and_device_tokens_together(client, alice):
    for n in range(15):
        get(client, "models", f"dhu_made-up-{n}")
        get(client, "device", f"dht_made-up-{n}")

    assert get(client, "models", "dhu_one-more").status_code == 429


def test_it_lets_the_address_in_again_when_the_lockout_is_over(client, alice):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    for n in range(30):
        get(client, "models", f"dhu_made-up-{n}")
    assert get(client, "models", right).status_code == 429

    # 10 minutes later.
    earlier = timezone.now() - timedelta(minutes=10, seconds=1)
    TokenFailures.objects.update(window_started_at=earlier, locked_until=earlier)

    assert get(client, "models", right).status_code == 200
    assert get(client, "models", "dhu_made-up").status_code == 401
    assert TokenFailures.objects.get(address=GUESSER).failures == 1


def test_it_counts_only_presented_tokens_not_missing_ones(client, alice):
    answers = [get(client, "models") for _ in range(40)] + [get(client, "device")] * 5

    assert {a.status_code for a in answers} == {401}
    assert not TokenFailures.objects.exists()


def test_a_right_token_writes_no_count(client, alice, make_device):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    _, device_token = make_device("edge-1")

    for _ in range(40):
        assert get(client, "models", right).status_code == 200
        assert get(client, "device", device_token).status_code == 200

    assert not TokenFailures.objects.exists()


def test_it_logs_one_line_when_it_locks_an_address_out(client, alice, caplog):
    with caplog.at_level(logging.WARNING, logger="deployhub.security"):
        for n in range(45):
            get(client, "models", f"dhu_made-up-{n}")

    lines = [r.getMessage() for r in caplog.records if r.name == "deployhub.security"]
    assert lines == [
        f"token authentication locked out for 600 s: {GUESSER} after 30 made-up tokens "
        "(last on /api/v1/models)"
    ]


def test_it_takes_the_limit_and_the_lockout_from_settings(client, alice, settings):
    settings.DEPLOYHUB_TOKEN_FAILURE_LIMIT = 3
    settings.DEPLOYHUB_TOKEN_LOCKOUT_SECONDS = 120

    statuses = [get(client, "models", f"dhu_made-up-{n}").status_code for n in range(4)]

    assert statuses == [401, 401, 401, 429]
    assert 110 <= int(get(client, "models", "dhu_x")["Retry-After"]) <= 120


def test_it_counts_by_the_address_the_proxy_saw_when_told_there_is_one(client, alice, settings):
    settings.DEPLOYHUB_PROXY_COUNT = 1
    behind_proxy = {"REMOTE_ADDR": "10.0.0.1"}
    for n in range(30):
        client.get(
            "/api/v1/models",
            HTTP_AUTHORIZATION=f"Bearer dhu_made-up-{n}",
            HTTP_X_FORWARDED_FOR=f"203.0.113.9, {GUESSER}",
            **behind_proxy,
        )

    assert set(TokenFailures.objects.values_list("address", flat=True)) == {GUESSER}
    right = token_for(alice)
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR=GUESSER, **right).status_code == 429
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR=NEIGHBOUR, **right).status_code == 200
    # A header that is not an address is not trusted: the peer is counted instead.
    client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer x", HTTP_X_FORWARDED_FOR="junk")
    assert TokenFailures.objects.filter(address="127.0.0.1").exists()
