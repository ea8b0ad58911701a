"""Every API v1 operation the client calls, declared once: its operationId (the hub's view
name), method, path template and the fields the client may send.

tests/test_client.py reads the hub's live /api/v1/openapi.json and checks each one exists
with that method and path and takes those fields, so the client cannot drift from the hub.
Hub.call refuses to send a field its operation does not declare.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

Method = TypeVar("Method", bound=Callable)


@dataclass(frozen=True)
class Operation:
    """One call of API v1: `path` is relative to /api/v1/, with {pk}-style parameters."""

    operation_id: str
    method: str
    path: str
    fields: tuple[str, ...] = ()
    body: str | None = None  # "json", "multipart" or None
    query: tuple[str, ...] = ()
    paged: bool = False


OPERATIONS: dict[str, Operation] = {}


def operation(
    operation_id: str,
    method: str,
    path: str,
    fields: Iterable[str] = (),
    body: str | None = None,
    query: Iterable[str] = (),
    paged: bool = False,
) -> Operation:
    """Declare an operation and remember it in OPERATIONS."""
    declared = Operation(operation_id, method, path, tuple(fields), body, tuple(query), paged)
    OPERATIONS[operation_id] = declared
    return declared


def calls(*operations: Operation) -> Callable[[Method], Method]:
    """Mark a client method with the operations it calls (read by the schema test)."""

    def mark(method: Method) -> Method:
        method.operations = operations  # type: ignore[attr-defined]
        return method

    return mark


MULTIPART_VERSION = ("file", "notes", "preprocessing", "contract", "export_on")

MODEL_LIST = operation("models", "GET", "models", paged=True)
MODEL_CREATE = operation(
    "create_model_with_its_file",
    "POST",
    "models",
    ("team", "name", "description", *MULTIPART_VERSION),
    body="multipart",
)
MODEL_DETAIL = operation("model_detail", "GET", "models/{pk}")
MODEL_VERSIONS = operation(
    "upload_version", "POST", "models/{pk}/versions", MULTIPART_VERSION, body="multipart"
)
VERSION_DATASETS = operation(
    "attach_dataset", "POST", "versions/{pk}/datasets", ("kind", "name", "file"), "multipart"
)
VERSION_AUTO = operation("version_auto", "POST", "versions/{pk}/auto", ("device_class",), "json")
AUTO_RUN_DETAIL = operation("auto_run_detail", "GET", "auto-runs/{pk}")
VERSION_AUTO_RUNS = operation(
    "version_auto_runs", "GET", "versions/{pk}/auto-runs", query=("device_class",), paged=True
)
RESULT_FILTERS = ("device_class", "backend", "precision", "vmin", "vmax")
MODEL_RESULTS = operation("model_results_json", "GET", "models/{pk}/results", query=RESULT_FILTERS)
MODEL_RESULTS_CSV = operation(
    "model_results_csv", "GET", "models/{pk}/results/{kind}.csv", query=RESULT_FILTERS
)

JOB_LIST = operation(
    "jobs_list",
    "GET",
    "jobs",
    query=("state", "kind", "device_class", "model_version"),
    paged=True,
)
# One body per kind (compile, benchmark, batch-sweep, evaluate, parity, export): the fields
# of them all; the hub refuses a field the kind does not take (400 naming it).
JOB_SUBMIT = operation(
    "jobs_submit",
    "POST",
    "jobs",
    (
        "kind",
        "model_version",
        "engine",
        "device_class",
        "backend",
        "build_config",
        "params",
        "dataset",
        "golden_set",
        "max_samples",
        "tolerance",
        "pack",
        "opset",
    ),
    body="json",
)
JOB_DETAIL = operation("job_detail", "GET", "jobs/{pk}")
JOB_CANCEL = operation("job_cancel", "POST", "jobs/{pk}/cancel")
JOB_LOG = operation("job_log", "GET", "jobs/{pk}/log")

DEVICE_CLASSES = operation("device_classes", "GET", "device-classes", paged=True)
DEVICE_LIST = operation(
    "devices_list", "GET", "devices", query=("device_class", "online", "draining"), paged=True
)

ENGINE_DETAIL = operation("engine_detail", "GET", "engines/{pk}")
ENGINE_COMPATIBILITY = operation(
    "engine_compatibility", "POST", "engines/{pk}/compatibility", ("fingerprint",), "json"
)
ENGINE_FILE = operation("engine_file", "GET", "engines/{pk}/file")

RELEASE_PROPOSE = operation(
    "engine_releases", "POST", "engines/{pk}/releases", ("note", "device_class"), "json"
)
RELEASE_DETAIL = operation("release_detail", "GET", "releases/{pk}")
RELEASE_SUBMIT = operation("release_submit", "POST", "releases/{pk}/submit", body="json")
RELEASE_REVIEW = operation(
    "release_reviews", "POST", "releases/{pk}/reviews", ("decision", "comment"), "json"
)
RELEASE_PROMOTE = operation("release_promote", "POST", "releases/{pk}/promote", body="json")
RELEASE_ROLLBACK = operation(
    "release_rollback", "POST", "releases/{pk}/rollback", ("reason",), "json"
)
MODEL_RELEASES = operation("model_releases", "GET", "models/{pk}/releases", paged=True)
