"""The DeployHub client: a Python API over the hub's API v1 and the `deployhub` command.

    from deployhub_client import Hub
    hub = Hub()  # DEPLOYHUB_URL / DEPLOYHUB_TOKEN, or what `deployhub login` stored
    version = hub.upload("model.onnx", model="resnet18")

Installs without Django (pip install "deployhub[client]") and never imports the hub.
"""

from deployhub_client.hub import Hub, HubError

__all__ = ["Hub", "HubError"]
