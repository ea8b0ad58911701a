"""Simulated HTTPS-mode devices: many devices asking the hub for work, from one process.

`python -m bench.asking` reads its orders as one line of JSON on stdin
({"url": ..., "tokens": [...], "wait": 50, "ramp_s": 10}) and runs until stdin closes.
Each device keeps one keep-alive HTTP/1.1 connection and does what workers/https_mode.py's
Asker does: ask `POST device/work {"wait": 50}`, ask again as soon as the answer comes
(a worker would run the job first), wait out `retry_after` when the hub says one, and after
a failed ask (a dropped connection, a refused one, a 5xx) wait reconnect_delay(failures),
imported from the worker, so the bench holds the worker's own policy.

One process with asyncio and raw sockets, not a thread per device: a thousand OS threads in
the load generator would take the hub's cores on a 2-core machine and distort its CPU figure.
It prints `job <id> <time>` when a device receives a job (time.time(), the bench's clock on
the same machine), and at the end `summary <json>`: answers by status, the first failures,
and when each device sent its successful and its failed asks (time.time()).
"""

import asyncio
import json
import random
import sys
import time
import urllib.parse

from workers.https_mode import reconnect_delay
from workers.version import user_agent

PATH = "/api/v1/device/work"
ANSWER_GRACE_S = 30  # past the wait asked for, an ask with no answer is a failure


class AskFailed(Exception):
    """An ask that got no usable answer: what a worker would back off after."""


def request_bytes(host, token, wait):
    """One ask for work as a worker sends it (its User-Agent, a JSON body)."""
    body = json.dumps({"wait": wait}).encode()
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"User-Agent: {user_agent()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def parse_head(head):
    """Return (status, {lower-case header name: value}) of a response's head (bytes)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise AskFailed(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Device:
    """One simulated device: its connection, its failures in a row, what its asks met."""

    def __init__(self, number, token, orders):
        self.number = number
        self.request = request_bytes(orders["host"], token, orders["wait"])
        self.orders = orders
        self.streams = None
        self.failures = 0
        # time.time() when each ask was sent: a held ask is answered up to `wait` s later,
        # and a device is back when its ask lands, not when its wait ends.
        self.asked = []  # every ask
        self.ok = []  # asks answered 200
        self.failed = []  # asks that failed

    async def ask(self):
        """Send one ask on the kept connection (opened anew if need be); return (status, body)."""
        if self.streams is None:
            self.streams = await asyncio.open_connection(
                self.orders["hostname"], self.orders["port"]
            )
        reader, writer = self.streams
        writer.write(self.request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status, headers = parse_head(head)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def close(self):
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None

    async def run(self, report):
        """Ask, again and again, as the worker's Asker does, until cancelled."""
        await asyncio.sleep(random.uniform(0, self.orders["ramp_s"]))
        while True:
            sent = time.time()
            self.asked.append(sent)
            try:
                status, body = await asyncio.wait_for(
                    self.ask(), self.orders["wait"] + ANSWER_GRACE_S
                )
                if status != 200:
                    raise AskFailed(f"{status} {body[:200].decode(errors='replace')}")
            except (TimeoutError, OSError, asyncio.IncompleteReadError, AskFailed) as error:
                self.close()
                self.failures += 1
                self.failed.append(time.time())
                report.failure(self, status_of(error), error)
                await asyncio.sleep(reconnect_delay(self.failures))
                continue
            self.failures = 0
            self.ok.append(sent)
            answer = json.loads(body)
            report.answer(answer)
            if answer.get("job") is None and answer.get("retry_after"):
                await asyncio.sleep(answer["retry_after"])


def status_of(error):
    """The name a failure is counted under: its HTTP status, or the kind of error."""
    if isinstance(error, AskFailed) and str(error)[:3].isdigit():
        return str(error)[:3]
    return type(error).__name__


class Report:
    """What the devices met, printed as it happens (jobs) and at the end (the summary)."""

    def __init__(self):
        self.statuses = {}
        self.first_failures = []

    def failure(self, device, status, error):
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if len(self.first_failures) < 5:
            self.first_failures.append(f"device {device.number}: {status}: {error}"[:300])

    def answer(self, answer):
        """Count a 200; print a job received at once, with the time it came."""
        if answer.get("job") is not None:
            print(f"job {answer['job']['id']} {time.time():.6f}", flush=True)
        # Told to come back later: every thread the hub process may hold was holding an ask.
        status = "200 come back later" if answer.get("retry_after") else "200"
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def summary(self, devices):
        return {
            "statuses": self.statuses,
            "failures": self.first_failures,
            "devices": [{"asked": d.asked, "ok": d.ok, "failed": d.failed} for d in devices],
        }


def orders_from(line):
    """The run's orders, with the hub's address split as the sockets need it."""
    orders = json.loads(line)
    url = urllib.parse.urlsplit(orders["url"])
    orders.update(hostname=url.hostname, port=url.port, host=url.netloc)
    orders.setdefault("wait", 25)
    orders.setdefault("ramp_s", 10)
    return orders


async def main():
    loop = asyncio.get_running_loop()
    orders = orders_from(await loop.run_in_executor(None, sys.stdin.readline))
    report = Report()
    devices = [Device(n, token, orders) for n, token in enumerate(orders["tokens"])]
    tasks = [asyncio.create_task(device.run(report)) for device in devices]
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for device in devices:
        device.close()
    print("summary " + json.dumps(report.summary(devices)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
