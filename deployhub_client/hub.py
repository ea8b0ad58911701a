"""The connection to a hub: its URL and a personal (or pipeline) token, one way to call an
operation of API v1 (docs/api.md), and one way to read its paged lists.

Every error the hub answers becomes a HubError with the status and the hub's own
{"error": ...} message, so a script can tell "not found" from "not allowed".
"""

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from deployhub_client import config
from deployhub_client import operations as ops
from deployhub_client.multipart import MultipartStream, Progress
from deployhub_client.operations import Operation, calls

API_PREFIX = "/api/v1/"
POLL_SECONDS = 5.0
PAGE_SIZE = 100
TIMEOUT_SECONDS = 60


class HubError(Exception):
    """The hub refused a call (status 4xx/5xx) or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message, self.body = status, message, body


class Unreachable(HubError):
    """The hub did not answer: the network, its address, or a timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


def api_base(url: str) -> str:
    """The hub's API v1 root from its address, with or without /api/v1 already on it."""
    url = url.rstrip("/")
    if url.endswith(API_PREFIX.rstrip("/")):
        url = url[: -len(API_PREFIX.rstrip("/"))]
    return url + API_PREFIX


class Hub:
    """One hub: Hub("https://hub.example", "dhu_..."), or Hub() to read DEPLOYHUB_URL and
    DEPLOYHUB_TOKEN, else the file `deployhub login` wrote (deployhub_client.config)."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        url, token = config.resolve(url, token)
        if not url:
            raise HubError(401, "No hub: run `deployhub login` or set DEPLOYHUB_URL.")
        if not token:
            raise HubError(401, "No token: run `deployhub login` or set DEPLOYHUB_TOKEN.")
        self.url, self.token = url.rstrip("/"), token
        self.base = api_base(url)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        from deployhub_client.engines import Engines
        from deployhub_client.jobs import Jobs
        from deployhub_client.releases import Releases

        self.jobs, self.releases, self.engines = Jobs(self), Releases(self), Engines(self)

    def __repr__(self) -> str:
        return f"Hub({self.url!r})"

    def send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send one request to an API v1 path ("jobs/12"); answer the response when it is a
        success, raise HubError with the hub's status and message otherwise."""
        kwargs.setdefault("timeout", TIMEOUT_SECONDS)
        try:
            response = self.session.request(method, self.base + path.lstrip("/"), **kwargs)
        except requests.RequestException as exc:
            raise Unreachable(f"Could not reach {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise error_of(response)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call an API v1 path and answer its JSON body (None when it has none); keyword
        arguments are requests' (json=, params=, data=, files=)."""
        response = self.send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise HubError(response.status_code, "The hub's answer is not JSON.") from exc

    def pages(self, path: str, params: dict | None = None, size: int = PAGE_SIZE) -> Iterator:
        """Every item of a paged list ({"items": [...], "count": N}), asking page by page."""
        offset = 0
        while True:
            asked = {**(params or {}), "limit": size, "offset": offset}
            page = self.request("GET", path, params=asked)
            yield from page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["count"]:
                return

    def call(self, operation: Operation, pk: Any = None, **kwargs: Any) -> Any:
        """Call a declared operation (deployhub_client.operations) on the object pk; a field
        the operation does not declare is a mistake here, never sent."""
        sent = {**(kwargs.get("json") or {}), **(kwargs.get("data") or {})}
        undeclared = set(sent) - set(operation.fields)
        if undeclared:
            raise ValueError(f"{operation.operation_id} takes no {sorted(undeclared)}")
        return self.request(operation.method, path_of(operation, pk), **kwargs)

    def listed(self, operation: Operation, pk: Any = None, **params: Any) -> list:
        """Every item of a paged operation's list, the query's empty filters left out."""
        return list(self.pages(path_of(operation, pk), query(operation, params)))

    # The registry.

    @calls(ops.MODEL_LIST)
    def models(self) -> list[dict]:
        """The models of the caller's teams."""
        return self.listed(ops.MODEL_LIST)

    @calls(ops.MODEL_DETAIL, ops.MODEL_LIST)
    def model(self, model: int | str) -> dict:
        """A model, with its versions, by id or by name (HubError 404 when there is none)."""
        return self.request("GET", path_of(ops.MODEL_DETAIL, self.model_id(model)))

    @calls(ops.MODEL_LIST)
    def model_id(self, model: int | str) -> int:
        """The id of a model given by id or name; HubError 404 when no model has that name."""
        found = self.find_model(model)
        if found is None:
            raise HubError(404, f"No model named {model!r} in your teams.")
        return found

    @calls(ops.MODEL_LIST)
    def find_model(self, model: int | str) -> int | None:
        """The id of a model given by id or name, or None when no model has that name."""
        if isinstance(model, int) or str(model).isdigit():
            return int(model)
        return next((m["id"] for m in self.models() if m["name"] == model), None)

    @calls(ops.MODEL_DETAIL, ops.MODEL_LIST)
    def version(self, model: int | str, number: int | None = None) -> dict:
        """A model's version by number (its newest when number is None)."""
        versions = self.model(model).get("versions") or []
        if number is not None:
            versions = [v for v in versions if v["number"] == int(number)]
        if not versions:
            which = f"version {number}" if number is not None else "a version"
            raise HubError(404, f"Model {model!r} has no {which}.")
        return versions[-1]

    @calls(ops.MODEL_LIST, ops.MODEL_CREATE, ops.MODEL_VERSIONS)
    def upload(
        self,
        path: str | Path,
        model: int | str,
        contract: dict | None = None,
        spec: dict | None = None,
        notes: str = "",
        team: str | None = None,
        export_on: str | None = None,
        on_progress: Progress | None = None,
    ) -> dict:
        """Upload a model file as a new version of `model` (an id or a name) and answer the
        version's JSON. A name no model has creates the model (in `team`, needed when the
        caller is in several). `contract` is the input-shape contract, `spec` the
        preprocessing spec; on_progress(sent, total) follows the bytes."""
        fields = {"notes": notes, "contract": contract, "preprocessing": spec}
        fields.update(export_on=export_on)
        model_id = self.find_model(model)
        if model_id is None:
            fields.update(name=str(model), team=team)
            answer = self.upload_file(ops.MODEL_CREATE, None, path, fields, on_progress)
            return {**answer["version"], "model_name": answer["name"]}
        return self.upload_file(ops.MODEL_VERSIONS, model_id, path, fields, on_progress)

    @calls(ops.VERSION_DATASETS)
    def add_dataset(
        self,
        version: int,
        path: str | Path,
        kind: str,
        name: str,
        on_progress: Progress | None = None,
    ) -> dict:
        """Attach a dataset file (kind "validation" or "calibration") to a version."""
        fields = {"kind": kind, "name": name}
        return self.upload_file(ops.VERSION_DATASETS, version, path, fields, on_progress)

    def upload_file(
        self,
        operation: Operation,
        pk: Any,
        path: str | Path,
        fields: dict[str, Any],
        on_progress: Progress | None = None,
    ) -> Any:
        """Stream a file and form fields to a multipart operation (fields None are left out,
        dicts sent as JSON text)."""
        form = {
            name: json.dumps(value) if isinstance(value, dict | list) else value
            for name, value in fields.items()
            if value not in (None, "")
        }
        undeclared = {*form, "file"} - set(operation.fields)
        if undeclared:
            raise ValueError(f"{operation.operation_id} takes no {sorted(undeclared)}")
        if not Path(path).is_file():
            raise HubError(0, f"No file at {path}.")
        body = MultipartStream(form, "file", Path(path), on_progress)
        headers = {"Content-Type": body.content_type}
        return self.request(operation.method, path_of(operation, pk), data=body, headers=headers)

    # Builds and results.

    @calls(ops.VERSION_AUTO, ops.AUTO_RUN_DETAIL)
    def auto(
        self,
        version: int,
        device_class: str,
        wait: bool = True,
        on_progress: Callable[[dict], None] | None = None,
        poll_seconds: float = POLL_SECONDS,
        timeout: float | None = None,
    ) -> dict:
        """Start auto mode on a version for a device class and answer the run (builds,
        outcome, recommended). With wait, poll until the run is done, calling
        on_progress(run) after each look; HubError 0 when timeout seconds pass first."""
        started = self.call(ops.VERSION_AUTO, version, json={"device_class": device_class})
        run = self.auto_run(started["auto_run"]["id"])
        return self.wait_for_run(run, on_progress, poll_seconds, timeout) if wait else run

    @calls(ops.VERSION_AUTO_RUNS)
    def auto_runs(self, version: int, device_class: str | None = None) -> list:
        """The version's auto runs, newest first (one class's with device_class)."""
        return self.listed(ops.VERSION_AUTO_RUNS, version, device_class=device_class)

    @calls(ops.AUTO_RUN_DETAIL)
    def auto_run(self, run: int) -> dict:
        """An auto run as it stands: its builds, their figures and the recommendation."""
        return self.call(ops.AUTO_RUN_DETAIL, run)

    @calls(ops.AUTO_RUN_DETAIL)
    def wait_for_run(
        self,
        run: dict,
        on_progress: Callable[[dict], None] | None = None,
        poll_seconds: float = POLL_SECONDS,
        timeout: float | None = None,
    ) -> dict:
        """Poll an auto run until its state is done; answer it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if on_progress:
                on_progress(run)
            if run["state"] == "done":
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise HubError(0, f"Auto run {run['id']} is still {run['state']}.", run)
            time.sleep(poll_seconds)
            run = self.auto_run(run["id"])

    @calls(ops.MODEL_RESULTS, ops.MODEL_LIST)
    def results(self, model: int | str, **filters: Any) -> dict:
        """Every benchmark and accuracy run of a model's versions; filters are the hub's
        (device_class=, backend=, precision=: a value or a list; vmin=, vmax=)."""
        asked = query(ops.MODEL_RESULTS, filters)
        return self.call(ops.MODEL_RESULTS, self.model_id(model), params=asked)

    @calls(ops.MODEL_RESULTS_CSV, ops.MODEL_LIST)
    def results_csv(self, model: int | str, kind: str = "benchmarks", **filters: Any) -> str:
        """One of the model's results tables as the hub's CSV (benchmarks, accuracy...)."""
        path = path_of(ops.MODEL_RESULTS_CSV, self.model_id(model), kind=kind)
        return self.send("GET", path, params=query(ops.MODEL_RESULTS_CSV, filters)).text

    # The fleet.

    @calls(ops.DEVICE_CLASSES)
    def classes(self) -> list[dict]:
        """The device classes of the caller's teams, with budgets and online devices."""
        return self.listed(ops.DEVICE_CLASSES)

    @calls(ops.DEVICE_LIST)
    def devices(
        self,
        device_class: str | None = None,
        online: bool | None = None,
        draining: bool | None = None,
    ) -> list[dict]:
        """The devices of the caller's teams' classes, filtered by class (a slug), online
        and draining."""
        flags = {"online": online, "draining": draining}
        return self.listed(ops.DEVICE_LIST, device_class=device_class, **flags)


def path_of(operation: Operation, pk: Any = None, **names: Any) -> str:
    """The operation's path with the object's id (and any other parameter) in it."""
    return operation.path.format(pk=pk, **names)


def query(operation: Operation, params: dict) -> dict:
    """The query string of a call: its filters given (None left out; booleans as the hub
    reads them), each one the operation declares."""
    asked = {name: value for name, value in params.items() if value is not None}
    undeclared = set(asked) - set(operation.query)
    if undeclared:
        raise ValueError(f"{operation.operation_id} takes no {sorted(undeclared)}")
    return {name: str(v).lower() if isinstance(v, bool) else v for name, v in asked.items()}


def error_of(response: requests.Response) -> HubError:
    """The HubError for a refused call: the hub's {"error": ...} text, or the status's reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    else:
        message = response.reason or f"HTTP {response.status_code}"
    return HubError(response.status_code, message, body)
