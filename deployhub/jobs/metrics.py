"""/metrics: the fleet's health in the Prometheus text format, read from the database.

gunicorn runs several processes and a device's call goes to any of them, so no figure is
counted in a process's memory: each scrape asks the database, in a fixed number of GROUP
BY queries whatever the fleet's size (docs/operations.md names every metric).

Off the public pages: a scraper sends DEPLOYHUB_METRICS_TOKEN as a bearer token, or calls
from one of DEPLOYHUB_METRICS_NETWORKS (by default the hub's own host).
"""

import hmac
import ipaddress
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Case, CharField, Count, DurationField, F, Q, Sum, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, NullIf
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from deployhub.devices.models import Device, DeviceClass, online_filter
from deployhub.jobs.backlog import queue_figures
from deployhub.jobs.models import ClaimRefusals, Job, JobState
from deployhub.teams.throttle import client_address

# Finished jobs' durations are read over this window: a scrape reads a day of jobs at most.
DURATION_WINDOW = timedelta(hours=24)
# Upper bounds, in seconds, of the duration histogram's buckets: a no-op to a long build.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)
NONE = "none"  # a label with no value: a job with no backend, a failure not classified


class FleetCollector:
    """Read the figures at scrape time (prometheus_client calls collect() per scrape)."""

    def collect(self):
        now = timezone.now()
        slugs = dict(DeviceClass.objects.values_list("pk", "slug"))
        yield from self.jobs(slugs)
        yield from self.queues(slugs, now)
        yield from self.devices(now)
        yield self.durations(now)
        yield self.failures()
        yield self.refusals()

    def jobs(self, slugs):
        gauge = GaugeMetricFamily(
            "deployhub_jobs",
            "Jobs in the database, by state, kind and device class.",
            labels=["state", "kind", "device_class"],
        )
        rows = Job.objects.values_list("state", "kind", "device_class").annotate(n=Count("pk"))
        for state, kind, class_id, count in rows.order_by():
            gauge.add_metric([state, kind, slugs.get(class_id, str(class_id))], count)
        yield gauge

    def queues(self, slugs, now):
        depth = GaugeMetricFamily(
            "deployhub_queued_jobs",
            "Jobs waiting for a device, per device class.",
            labels=["device_class"],
        )
        age = GaugeMetricFamily(
            "deployhub_oldest_queued_job_age_seconds",
            "Seconds since the oldest job waiting in a device class's queue was submitted "
            "(0 when none waits).",
            labels=["device_class"],
        )
        figures = queue_figures()
        for class_id, slug in sorted(slugs.items(), key=lambda item: item[1]):
            waiting, oldest = figures.get(class_id, (0, None))
            depth.add_metric([slug], waiting)
            age.add_metric([slug], max((now - oldest).total_seconds(), 0) if oldest else 0)
        yield depth
        yield age

    def devices(self, now):
        labels = ["device_class", "delivery"]
        registered = GaugeMetricFamily(
            "deployhub_devices_registered",
            "Devices registered (not revoked), by device class and delivery mode.",
            labels=labels,
        )
        online = GaugeMetricFamily(
            "deployhub_devices_online",
            f"Devices that sent a heartbeat in the last {settings.DEPLOYHUB_OFFLINE_AFTER} s "
            "(DEPLOYHUB_OFFLINE_AFTER; HTTPS devices: asked for work within "
            "DEPLOYHUB_POLL_SECONDS + 15 s), by device class and delivery mode.",
            labels=labels,
        )
        silent = GaugeMetricFamily(
            "deployhub_devices_silent",
            "Devices reported silent (past their class's silent_after_minutes) and not back.",
            labels=labels,
        )
        rows = (
            Device.objects.filter(revoked_at__isnull=True)
            .values_list("device_class__slug", "delivery")
            .annotate(
                registered=Count("pk"),
                online=Count("pk", filter=online_filter(now)),
                silent=Count("pk", filter=Q(silence_reported_at__isnull=False)),
            )
        )
        for slug, delivery, *counts in rows.order_by():
            for family, count in zip((registered, online, silent), counts, strict=True):
                family.add_metric([slug, delivery], count)
        yield from (registered, online, silent)

    def durations(self, now):
        hours = DURATION_WINDOW.total_seconds() / 3600
        histogram = HistogramMetricFamily(
            "deployhub_job_duration_seconds",
            f"Run time (started to finished) of the jobs that finished in the last {hours:g} h, "
            "by kind and backend.",
            labels=["kind", "backend"],
        )
        for (kind, backend), (counts, total) in duration_rows(now).items():
            histogram.add_metric([kind, backend], cumulative(counts), total)
        return histogram

    def failures(self):
        gauge = GaugeMetricFamily(
            "deployhub_job_failures",
            "Failed jobs in the database, by kind and failure category (how the worker "
            f"classified the failure; {NONE}: not classified).",
            labels=["kind", "category"],
        )
        failed = Job.objects.filter(state=JobState.FAILED)
        rows = failed.values_list("kind", "failure_category").annotate(n=Count("pk"))
        for kind, category, count in rows.order_by():
            gauge.add_metric([kind, category or NONE], count)
        return gauge

    def refusals(self):
        counter = CounterMetricFamily(
            "deployhub_claims_refused",
            "Claims of a job the hub refused a device, by reason (stale_attempt, wrong_class, "
            "draining, not_queued), counted in every hub process.",
            labels=["reason"],
        )
        for reason, count in ClaimRefusals.objects.values_list("reason", "count"):
            counter.add_metric([reason], count)
        return counter


def duration_rows(now):
    """Return {(kind, backend): ([jobs per bucket], seconds in all)} for the window's jobs.

    Bucketed in the database: one row per kind, backend and bucket, whatever the count.
    """
    took = F("finished_at") - F("started_at")
    bucket = Case(
        *(
            When(took__lte=timedelta(seconds=bound), then=Value(index))
            for index, bound in enumerate(DURATION_BUCKETS)
        ),
        default=Value(len(DURATION_BUCKETS)),
    )
    backend = Coalesce(
        NullIf(KeyTextTransform("backend", "params"), Value("")),
        "engine__backend",
        Value(NONE),
        output_field=CharField(),
    )
    finished = Job.objects.filter(
        finished_at__gte=now - DURATION_WINDOW, started_at__isnull=False, finished_at__isnull=False
    )
    rows = (
        finished.annotate(took=took, job_backend=backend)
        .annotate(bucket=bucket)
        .values_list("kind", "job_backend", "bucket")
        .annotate(n=Count("pk"), seconds=Sum("took", output_field=DurationField()))
    )
    found: dict[tuple[str, str], tuple[list[int], Any]] = {}
    for kind, job_backend, index, count, seconds in rows.order_by():
        counts, total = found.setdefault(
            (kind, job_backend), ([0] * (len(DURATION_BUCKETS) + 1), 0)
        )
        counts[index] += count
        found[(kind, job_backend)] = (counts, total + seconds.total_seconds())
    return found


def cumulative(counts):
    """Prometheus buckets from per-bucket counts: [(upper bound, jobs at or under it)]."""
    bounds = [str(float(bound)) for bound in DURATION_BUCKETS] + ["+Inf"]
    running, buckets = 0, []
    for bound, count in zip(bounds, counts, strict=True):
        running += count
        buckets.append((bound, running))
    return buckets


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(FleetCollector())


def scrape_allowed(request):
    """Tell whether the caller may read /metrics: the metrics token, or an allowed network."""
    token = settings.DEPLOYHUB_METRICS_TOKEN
    sent = request.META.get("HTTP_AUTHORIZATION", "")
    if token and sent.startswith("Bearer "):
        if hmac.compare_digest(sent.removeprefix("Bearer ").encode(), token.encode()):
            return True
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    networks = settings.DEPLOYHUB_METRICS_NETWORKS
    return any(address in ipaddress.ip_network(network) for network in networks)


@require_GET
def metrics(request):
    """Serve the fleet's figures to an allowed scraper; anyone else gets a 403."""
    if not scrape_allowed(request):
        message = (
            "/metrics is for the hub's monitoring: send DEPLOYHUB_METRICS_TOKEN as a bearer "
            "token, or call from DEPLOYHUB_METRICS_NETWORKS."
        )
        return JsonResponse({"error": message}, status=403)
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
