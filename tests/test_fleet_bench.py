"""make bench's fleet rows (bench/fleet.py, bench/asking.py): the sums they report.

The rows themselves need a hub, PostgreSQL and a thousand sockets; what they compute from
what the devices met is checked here, with no service.
"""

import random

import pytest

from bench import asking, fleet
from workers.version import user_agent


def test_the_busiest_second_is_any_one_second_window_not_a_clock_second():
    # 0.6 .. 1.4 straddles two clock seconds but lies within one second of itself.
    assert fleet.peak_per_second([0.6, 0.8, 1.2, 1.4, 3.0]) == 4
    assert fleet.peak_per_second([0.0, 1.0, 2.0]) == 1  # a window holds [t, t + 1)
    assert fleet.peak_per_second([5.0]) == 1


def test_the_spread_of_returns_is_counted_from_when_the_hub_answered_again():
    back = 100.0
    returns = [back + n / 10 for n in range(100)]  # one every 0.1 s for 10 s

    spread = fleet.reconnect_spread(returns, back)

    assert spread["p10"] == pytest.approx(0.99)
    assert spread["p90"] == pytest.approx(8.91)
    assert spread["peak"] == 10 and spread["peak_share"] == 10


def test_a_herd_puts_every_return_in_one_second():
    spread = fleet.reconnect_spread([7.0 + n / 1000 for n in range(300)], 7.0)

    assert spread["peak_share"] == 100


def test_the_workers_reconnect_policy_spreads_a_thousand_devices_over_seconds():
    returns = fleet.simulated_returns(8.0, 1000, random.Random(1))
    spread = fleet.reconnect_spread(returns, 0.0)

    assert min(returns) >= 0
    assert spread["p90"] - spread["p10"] > 5
    assert spread["peak_share"] < fleet.PEAK_SECOND_SHARE


def test_asks_per_second_count_asks_sent_in_the_window_answered_or_still_held():
    summary = {
        "devices": [
            {"asked": [1.0, 10.0, 35.0, 61.0], "ok": [1.0, 10.0], "failed": []},
            {"asked": [59.9], "ok": [], "failed": []},  # held when the run ended
        ]
    }

    assert fleet.asks_between(summary, 5.0, 55.0) == 3


def test_only_answers_other_than_200_count_as_failed_asks():
    summary = {
        "statuses": {"200": 40, "200 come back later": 3, "503": 2, "ConnectionRefusedError": 5}
    }

    assert fleet.failed_asks(summary) == 7
    assert fleet.statuses_text(summary).startswith("200×40, 200 come back later×3")


def test_a_simulated_device_asks_as_the_worker_does():
    sent = asking.request_bytes("127.0.0.1:8001", "dht_secret", 25).decode()

    head, body = sent.split("\r\n\r\n")
    assert head.startswith("POST /api/v1/device/work HTTP/1.1\r\n")
    assert "Authorization: Bearer dht_secret" in head
    assert f"User-Agent: {user_agent()}" in head
    assert f"Content-Length: {len(body)}" in head and body == '{"wait": 25}'


def test_an_answers_head_gives_its_status_and_headers():
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\nConnection: close\r\n\r\n"

    assert asking.parse_head(head) == (503, {"content-length": "12", "connection": "close"})
    with pytest.raises(asking.AskFailed, match="not an HTTP answer"):
        asking.parse_head(b"SSH-2.0-OpenSSH\r\n\r\n")
