"""The benchmark request: scenario, duration, batch and sweep, checked before anything is queued."""

from django import forms

from deployhub.benchmarks.batches import BatchRefused, check_batch, sweep_sizes
from deployhub.benchmarks.models import Scenario
from deployhub.devices.models import DeviceClass

# The page's and the API's defaults; README.md quotes them (tests/test_pages_benchmark_defaults.py)
DEFAULT_DURATION_S = 10.0
DEFAULT_WARMUP_S = 2.0
DEFAULT_WARMUP_ITERATIONS = 10
OPTIONAL_PARAMS = ("intra_op_threads", "cv_threshold", "drift_threshold", "stability_floor_ms")


class BenchmarkForm(forms.Form):
    """What to measure; the device class is a field unless it is fixed (an engine's)."""

    device_class = forms.ModelChoiceField(
        queryset=DeviceClass.objects.none(),
        empty_label=None,
        error_messages={"invalid_choice": "Choose one of your team's device classes."},
    )
    scenario = forms.ChoiceField(
        choices=Scenario.choices(),
        required=False,
        initial=Scenario.SINGLE_STREAM,
        help_text="MLPerf scenario: SingleStream (one query at a time), Server (a target "
        "rate), Offline (throughput).",
    )
    duration_s = forms.FloatField(
        label="Duration (s)",
        min_value=0.5,
        max_value=600,
        required=False,
        initial=DEFAULT_DURATION_S,
    )
    warmup_s = forms.FloatField(
        label="Warm-up (s)", min_value=0, max_value=120, required=False, initial=DEFAULT_WARMUP_S
    )
    iterations = forms.IntegerField(
        min_value=1,
        max_value=1_000_000,
        required=False,
        help_text="A fixed count instead of the duration.",
    )
    warmup_iterations = forms.IntegerField(
        min_value=0,
        max_value=10_000,
        required=False,
        help_text=f"With iterations; {DEFAULT_WARMUP_ITERATIONS} when empty.",
    )
    batch_size = forms.IntegerField(min_value=1, max_value=1024, required=False, initial=1)
    batch_sweep = forms.BooleanField(
        required=False, help_text="Also measure batch 1, 2, 4 … up to the contract's largest."
    )
    sweep_duration_s = forms.FloatField(
        label="Per sweep step (s)", min_value=0.5, max_value=120, required=False
    )
    target_qps = forms.FloatField(
        label="Target rate (queries/s)",
        min_value=0.001,
        max_value=1_000_000,
        required=False,
        help_text="Server only; empty: half what a SingleStream run manages.",
    )
    samples = forms.IntegerField(
        label="Offline samples", min_value=1, max_value=1_000_000, required=False
    )
    cuda_graphs = forms.BooleanField(required=False, label="CUDA graphs")
    intra_op_threads = forms.IntegerField(min_value=0, max_value=1024, required=False)
    cv_threshold = forms.FloatField(min_value=0.001, max_value=10, required=False)
    drift_threshold = forms.FloatField(min_value=0.001, max_value=10, required=False)
    stability_floor_ms = forms.FloatField(
        label="stability floor (ms)",
        min_value=0,
        max_value=10_000,
        required=False,
        help_text="Thresholds apply to max(latency, this): 1 ms by default.",
    )

    def __init__(self, *args, team, version, device_class=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version
        self.fixed_class = device_class
        if device_class is not None:
            del self.fields["device_class"]
        else:
            self.fields["device_class"].queryset = team.device_classes.order_by("slug")
        if not self.can_sweep:
            # Only the checkbox: a submitted sweep is still checked, and refused with the reason.
            self.fields["batch_sweep"].widget.attrs["disabled"] = True

    @property
    def can_sweep(self):
        try:
            return bool(sweep_sizes(self.version))
        except BatchRefused:
            return False

    @property
    def sweep_hint(self):
        """Say which batch sizes a sweep would measure, or why there is none."""
        try:
            return "Sweeps batch " + ", ".join(map(str, sweep_sizes(self.version))) + "."
        except BatchRefused as exc:
            return str(exc)

    @property
    def chosen_class(self):
        return self.fixed_class or self.cleaned_data.get("device_class")

    def clean_scenario(self):
        return self.cleaned_data["scenario"] or Scenario.SINGLE_STREAM

    def clean_batch_size(self):
        batch = self.cleaned_data["batch_size"] or 1
        try:
            check_batch(self.version, batch)
        except BatchRefused as exc:
            raise forms.ValidationError(str(exc)) from exc
        return batch

    def clean(self):
        data = super().clean()
        self._check_scenario_only("target_qps", Scenario.SERVER, "the Server scenario")
        self._check_scenario_only("samples", Scenario.OFFLINE, "the Offline scenario")
        if data.get("sweep_duration_s") and not data.get("batch_sweep"):
            self.add_error("sweep_duration_s", "A sweep step duration needs the batch sweep.")
        if data.get("batch_sweep"):
            self._sweep()
        return data

    def _check_scenario_only(self, field, scenario, what):
        data = self.cleaned_data
        if data.get(field) and data.get("scenario") not in (None, scenario):
            self.add_error(field, f"{self.fields[field].label or field} is for {what} only.")

    def _sweep(self):
        try:
            self.sweep = sweep_sizes(self.version)
        except BatchRefused as exc:
            self.add_error("batch_sweep", str(exc))

    def params(self):
        """Return the job params the worker reads (docs/protocol.md)."""
        data = self.cleaned_data
        params = {"scenario": data["scenario"], "batch_size": data["batch_size"]}
        params.update(self._timing())
        params.update(self._scenario_params())
        if data["batch_sweep"]:
            params["batch_sizes"] = self.sweep
            if data["sweep_duration_s"]:
                params["sweep_duration_s"] = data["sweep_duration_s"]
        if data["cuda_graphs"]:
            params["cuda_graphs"] = True
        params.update({k: data[k] for k in OPTIONAL_PARAMS if data[k] is not None})
        return params

    def _timing(self):
        data = self.cleaned_data
        if data["iterations"]:
            warmup = data["warmup_iterations"]
            return {
                "iterations": data["iterations"],
                "warmup_iterations": DEFAULT_WARMUP_ITERATIONS if warmup is None else warmup,
            }
        warmup = data["warmup_s"]
        return {
            "duration_s": data["duration_s"] or DEFAULT_DURATION_S,
            "warmup_s": DEFAULT_WARMUP_S if warmup is None else warmup,
        }

    def _scenario_params(self):
        data, scenario = self.cleaned_data, self.cleaned_data["scenario"]
        if scenario == Scenario.SERVER:
            budget = self.chosen_class.latency_budget_ms
            rate = {"target_qps": data["target_qps"]} if data["target_qps"] else {}
            return {**rate, **({"budget_ms": budget} if budget else {})}
        if scenario == Scenario.OFFLINE and data["samples"]:
            return {"samples": data["samples"]}
        return {}
