"""HTTPS mode: the worker asks the hub for its class's work and never touches the broker.

`deployhub-worker run` without a broker URL: the device needs nothing but the hub's
address and its token (docs/protocol.md, `POST device/work`). The hub holds each ask
open until a job of the device's class is queued (it claims the job for the device) or
the wait ends, so an idle device costs one call every POLL_WAIT_S seconds and a new job
reaches it as soon as it is committed.

A hub that cannot be reached (restarting, say) is asked again after a random wait whose
ceiling doubles with each failure (full jitter): a thousand devices that lost the hub at
once come back spread over seconds, not in one burst.
"""

import logging
import random
import signal
import threading

from workers import runner
from workers.client import RETRY_STATUSES, HubError, HubUnreachable, Unauthorized

logger = logging.getLogger("workers.https_mode")

POLL_WAIT_S = 50  # the hub caps it (DEPLOYHUB_POLL_SECONDS)
BACKOFF_BASE_S = 2.0
BACKOFF_CAP_S = 60.0


def reconnect_delay(failures, rng=random):
    """Seconds to wait after `failures` failed asks in a row: uniform up to a ceiling that
    doubles each time (2, 4, 8 ... 60 s)."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, failures - 1))
    return rng.uniform(0, ceiling)


class Asker:
    """The worker's loop in HTTPS mode: ask, run what comes, ask again, until stopped."""

    def __init__(self, client, context, stop=None):
        self.client = client
        self.context = context
        self.stop = stop or threading.Event()
        self.failures = 0
        self.running = False

    def serve(self):
        """Ask for and run jobs until stop is set (SIGTERM: after the job in hand)."""
        while not self.stop.is_set():
            answer = self._ask()
            if answer is None:
                continue
            self.context.draining = answer.get("state") == "draining"
            job = answer.get("job")
            if job is not None:
                self._run(job)
            elif answer.get("retry_after"):
                self.stop.wait(answer["retry_after"])

    def _ask(self):
        """Return the hub's answer to one ask, or None after waiting out a failure."""
        self.context.asking = True
        try:
            answer = self.client.next_job(POLL_WAIT_S)
        except Unauthorized:
            raise  # a revoked device or a refused worker: nothing to wait for
        except HubError as error:
            # A hub that is away, throttling, or failing (a 500 is the hub's fault, not this
            # device's): ask again later. Any other answer (401, 426) stops the worker.
            failing = error.status is not None and error.status >= 500
            if not (isinstance(error, HubUnreachable) or failing or error.status in RETRY_STATUSES):
                raise
            self.failures += 1
            delay = reconnect_delay(self.failures)
            logger.warning("asking the hub for work failed (%s); again in %.1f s", error, delay)
            self.stop.wait(delay)
            return None
        finally:
            self.context.asking = False
        if self.failures:
            logger.info("the hub answers again after %d failed ask(s)", self.failures)
        self.failures = 0
        return answer

    def _run(self, job):
        self.running = True
        try:
            runner.run_claimed_job(
                self.client,
                job,
                self.context.workdir,
                self.context.fingerprint,
                self.context.signing_public_key,
            )
        except HubUnreachable as error:  # the job's lease runs out and it is tried again
            logger.warning("job %s: lost the hub (%s)", job.get("id"), error)
        finally:
            self.running = False

    def stop_on_signals(self):
        """SIGTERM or SIGINT: stop now while only asking, or after the job in hand."""

        def handle(signum, frame):
            if self.running and not self.stop.is_set():
                logger.info("stopping after the job in hand (again to stop now)")
                self.stop.set()
                return
            raise SystemExit(0)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, handle)
