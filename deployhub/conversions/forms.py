from django import forms

from deployhub.devices.models import DeviceClass


class ConversionForm(forms.Form):
    """The device class whose worker exports a .pt2 or converts an ONNX file's opset."""

    device_class = forms.ModelChoiceField(queryset=DeviceClass.objects.none(), empty_label=None)

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["device_class"].queryset = team.device_classes.order_by("slug")
