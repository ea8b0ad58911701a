"""A hub's releases: propose an engine for production, submit, review, promote, roll back
(hub.releases). The rules are the hub's (docs/api.md, "Releases"): a refusal is a HubError
403 (the caller's role) or 409 (the release's state or gates) saying which rule refused."""

from typing import TYPE_CHECKING

from deployhub_client import operations as ops
from deployhub_client.operations import calls

if TYPE_CHECKING:
    from deployhub_client.hub import Hub

DECISIONS = ("approve", "request_changes", "reject")


class Releases:
    """hub.releases: each call answers the release it acted on."""

    def __init__(self, hub: "Hub") -> None:
        self.hub = hub

    @calls(ops.RELEASE_PROPOSE)
    def propose(self, engine: int, note: str = "", device_class: str | None = None) -> dict:
        """Propose an engine for production on its device class: a draft release."""
        body = {"note": note} | ({"device_class": device_class} if device_class else {})
        return self.hub.call(ops.RELEASE_PROPOSE, engine, json=body)

    @calls(ops.RELEASE_DETAIL)
    def get(self, release: int) -> dict:
        """A release: its state, gates, reviews, approvals and evidence."""
        return self.hub.call(ops.RELEASE_DETAIL, release)

    @calls(ops.MODEL_RELEASES, ops.MODEL_LIST)
    def list(self, model: int | str) -> list[dict]:
        """A model's releases, newest first."""
        return self.hub.listed(ops.MODEL_RELEASES, self.hub.model_id(model))

    @calls(ops.RELEASE_SUBMIT)
    def submit(self, release: int) -> dict:
        """Send a draft for review (its evidence pack is computed then)."""
        return self.hub.call(ops.RELEASE_SUBMIT, release, json={})

    @calls(ops.RELEASE_REVIEW)
    def review(self, release: int, decision: str, comment: str = "") -> dict:
        """Review a release: decision is approve, request_changes or reject."""
        body = {"decision": decision, "comment": comment}
        return self.hub.call(ops.RELEASE_REVIEW, release, json=body)

    @calls(ops.RELEASE_PROMOTE)
    def promote(self, release: int) -> dict:
        """Put an approved release in production on its class."""
        return self.hub.call(ops.RELEASE_PROMOTE, release, json={})

    @calls(ops.RELEASE_ROLLBACK)
    def rollback(self, release: int, reason: str) -> dict:
        """Roll back a production release; the one it replaced is production again."""
        return self.hub.call(ops.RELEASE_ROLLBACK, release, json={"reason": reason})
