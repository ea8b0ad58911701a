"""Devices waiting for work over HTTPS, and the news that wakes them (docs/protocol.md).

A device in HTTPS mode asks `POST device/work` and the hub holds the ask until its
class has a queued job or the wait ends. Holding costs a server thread and no CPU: the
thread sleeps on its class's condition here. One thread per hub process hears of new
work for every waiting device at once:

- on PostgreSQL it LISTENs on `deployhub_work`, where each job queued is announced with
  its class's id when its transaction commits (announce());
- elsewhere (make run's SQLite) it looks for queued jobs of the classes waited on, a few
  times a second, with one query, only while someone waits.

Each piece of news wakes one waiter of the class per process, never all of them: a
thousand devices of one class waiting, one job costs one claim attempt per process.
A waiter registers before it looks in the database, so news that arrives between its
look and its sleep is not lost.
"""

import logging
import os
import threading
import time
from contextlib import contextmanager

from django.conf import settings
from django.db import connection, connections

logger = logging.getLogger(__name__)

CHANNEL = "deployhub_work"
POLL_INTERVAL_S = 0.2  # without LISTEN: how often a process looks for work for its waiters
LISTEN_TIMEOUT_S = 1.0  # how often the listener looks up from its connection (to stop)
CHECK_EVERY_S = 30.0  # how often it makes sure its connection is alive
IDLE_EXIT_S = 120.0  # a listener with nobody waiting this long ends (and its connection)
RECONNECT_PAUSE_S = (0.5, 10.0)  # the listener's backoff after losing its connection
# The threads of a server process kept for other calls (heartbeats, completions, pages)
# when its asks for work are counted from its thread count (gunicorn_worker.HubWorker says
# it: DEPLOYHUB_SERVER_THREADS): up to this many, and at least half of them.
RESERVED_THREADS = 4
UNBOUNDED_WAITERS = 10_000


class Waiters:
    """The devices of this process waiting for work, by class, and the news for them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._conditions = {}  # class id -> Condition
        self._waiting = {}  # class id -> devices registered
        self._news = {}  # class id -> wake-ups not yet taken (at most one per waiter)
        self._devices = set()  # devices holding an ask here: one each
        self._listener = None
        self.stopping = threading.Event()
        self.last_waiter_at = time.monotonic()

    @property
    def count(self):
        with self._lock:
            return sum(self._waiting.values())

    def classes(self):
        with self._lock:
            return [class_id for class_id, n in self._waiting.items() if n]

    def holds_ask_of(self, device_id):
        """True when this process already holds an ask of the device."""
        with self._lock:
            return device_id in self._devices

    @contextmanager
    def registered(self, class_id, device_id=None):
        """Count the caller as waiting on the class while the block runs."""
        with self._lock:
            self._devices.add(device_id)
            self._waiting[class_id] = self._waiting.get(class_id, 0) + 1
            condition = self._conditions.setdefault(class_id, threading.Condition(self._lock))
        self._ensure_listener()
        try:
            yield condition
        finally:
            with self._lock:
                self._devices.discard(device_id)
                self.last_waiter_at = time.monotonic()
                self._waiting[class_id] -= 1
                self._news[class_id] = min(self._news.get(class_id, 0), self._waiting[class_id])

    def wait(self, class_id, condition, timeout):
        """Sleep until there is news for the class (True) or the timeout passes (False)."""
        deadline = time.monotonic() + timeout
        with condition:
            while not self._news.get(class_id):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not condition.wait(remaining):
                    return False
            self._news[class_id] -= 1
            return True

    def wake(self, class_id, everyone=False):
        """Tell one waiter of the class (every one: after the listener lost news) to look."""
        with self._lock:
            waiting = self._waiting.get(class_id, 0)
            if not waiting:
                return
            news = waiting if everyone else self._news.get(class_id, 0) + 1
            self._news[class_id] = min(news, waiting)
            self._conditions[class_id].notify(waiting if everyone else 1)

    def wake_all(self):
        for class_id in self.classes():
            self.wake(class_id, everyone=True)

    def idle(self):
        """True when the listener may end: asked to stop, or nobody has waited for a while;
        then it is forgotten at once, so the next waiter starts another (decided under the
        lock waiters register under: none can register between the look and the end)."""
        with self._lock:
            nobody = not any(self._waiting.values())
            ending = self.stopping.is_set() or (
                nobody and time.monotonic() - self.last_waiter_at > IDLE_EXIT_S
            )
            if ending and self._listener is threading.current_thread():
                self._listener = None
            return ending

    def stop_listening(self, timeout=5.0):
        """End this process's listener and close its connection (a test database's end)."""
        self.stopping.set()
        listener = self._listener  # it forgets itself as it ends (idle)
        if listener is not None:
            listener.join(timeout)
        self.stopping.clear()

    def _ensure_listener(self):
        with self._lock:
            if self._listener is not None and self._listener.is_alive():
                return
            target = _listen if connection.vendor == "postgresql" else _poll
            self._listener = threading.Thread(
                target=target, args=(self,), name="work-listener", daemon=True
            )
            self._listener.start()


WAITERS = Waiters()


def max_waiters():
    """How many asks for work this process holds open at once."""
    if settings.DEPLOYHUB_POLL_MAX_WAITERS:
        return settings.DEPLOYHUB_POLL_MAX_WAITERS
    threads = os.environ.get("DEPLOYHUB_SERVER_THREADS", "")
    if threads.isdigit():
        count = int(threads)
        return max(1, count - min(RESERVED_THREADS, (count + 1) // 2))
    return UNBOUNDED_WAITERS  # a server without a fixed thread count (runserver, tests)


def announce(device_class_id, job_id):
    """Tell every hub process's waiters of the class that a job is queued for it.

    On PostgreSQL inside a transaction the news leaves when it commits; elsewhere the
    waiters' processes find the job themselves (_poll). The payload names the job too:
    PostgreSQL delivers identical notifications of one transaction once, and auto mode
    queues its whole grid of builds in one.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{device_class_id}:{job_id}"])


def class_of(payload):
    """The class id a notification's payload names ("<class id>:<job id>"), or None."""
    class_id = payload.partition(":")[0]
    return int(class_id) if class_id.isascii() and class_id.isdigit() else None


def _listen(waiters):
    """LISTEN for news of queued jobs and wake the waiters it is for, until idle."""
    pause = RECONNECT_PAUSE_S[0]
    while not waiters.idle():
        started = time.monotonic()
        try:
            _listen_once(waiters)
        except Exception as error:  # the database restarted, a network blip
            if time.monotonic() - started > CHECK_EVERY_S:
                pause = RECONNECT_PAUSE_S[0]  # it had been listening: a new outage
            logger.warning("work listener lost its connection (%s); again in %.1f s", error, pause)
            waiters.wake_all()  # news may have come while nobody listened: everyone looks
            time.sleep(pause)
            pause = min(pause * 2, RECONNECT_PAUSE_S[1])


def _listen_once(waiters):
    import psycopg  # PostgreSQL's only

    # A connection of its own, never one of a pool (DATABASE_POOL_MAX_SIZE): it is held.
    raw = psycopg.connect(**connections["default"].get_connection_params())
    try:
        raw.autocommit = True
        raw.execute(f"LISTEN {CHANNEL}")
        waiters.wake_all()  # anything queued before LISTEN took effect
        checked = time.monotonic()
        while not waiters.idle():
            for notice in raw.notifies(timeout=LISTEN_TIMEOUT_S):
                if (class_id := class_of(notice.payload)) is not None:
                    waiters.wake(class_id)
            if time.monotonic() - checked > CHECK_EVERY_S:
                raw.execute("SELECT 1")  # a dead connection raises here, not silently
                checked = time.monotonic()
    finally:
        raw.close()


def _poll(waiters):
    """Without LISTEN: wake the waiters of classes that have queued jobs, until idle."""
    from deployhub.jobs.models import Job, JobState

    while not waiters.idle():
        time.sleep(POLL_INTERVAL_S)
        waited = waiters.classes()
        if not waited:
            continue
        try:
            queued = Job.objects.filter(state=JobState.QUEUED, device_class_id__in=waited)
            for class_id in set(queued.values_list("device_class_id", flat=True)):
                waiters.wake(class_id)
        except Exception as error:
            logger.warning("looking for work failed: %s", error)
        finally:
            connection.close()  # this thread's: never left open between looks
