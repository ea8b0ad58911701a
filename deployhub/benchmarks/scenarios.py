"""The scenarios a benchmark measures under (read by the model, the parsing and the gate)."""

from deployhub.core.choices import ChoiceSet


class Scenario(ChoiceSet):
    """How queries reach the model, named as MLPerf Inference names its scenarios."""

    SINGLE_STREAM = "single-stream"
    SERVER = "server"
    OFFLINE = "offline"
    CHOICES = (
        (SINGLE_STREAM, "SingleStream", "blue"),
        (SERVER, "Server", "purple"),
        (OFFLINE, "Offline", "teal"),
    )
    HELP = {
        SINGLE_STREAM: "one query at a time, each waits for the last (a camera feeding one model)",
        SERVER: "queries arrive at a target rate (Poisson); p99 at that rate decides",
        OFFLINE: "all samples at once; throughput decides",
    }
