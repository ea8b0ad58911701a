from django import forms

from deployhub.devices.models import DeviceClass
from deployhub.parity.actions import default_device_class


class ParityForm(forms.Form):
    file = forms.FileField(
        label="Parity pack",
        help_text="A .zip of a few raw images and tensors.npz (one tensor per image, "
        "keyed by the image's name without extension).",
    )
    device_class = forms.ModelChoiceField(
        queryset=DeviceClass.objects.none(),
        required=False,
        help_text="Whose worker runs the check; empty: the first class with a worker online.",
    )
    tolerance = forms.FloatField(
        required=False,
        help_text="Largest allowed absolute difference; empty: 1e-3 of the 0–1 pixel range "
        "in the spec's units.",
    )

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["device_class"].queryset = DeviceClass.objects.filter(team=team)
        if not self.is_bound:
            self.initial.setdefault("device_class", default_device_class(team))

    def clean_tolerance(self):
        tolerance = self.cleaned_data["tolerance"]
        if tolerance is not None and not tolerance > 0:
            raise forms.ValidationError("The tolerance must be greater than 0.")
        return tolerance
