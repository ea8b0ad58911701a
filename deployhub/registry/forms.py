from django import forms

from deployhub.devices.models import DeviceClass


class VersionUploadForm(forms.Form):
    file = forms.FileField(help_text="An ONNX model (.onnx).")
    notes = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class NewModelForm(VersionUploadForm):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    field_order = ["name", "description", "file", "notes"]


class BenchmarkForm(forms.Form):
    device_class = forms.ModelChoiceField(queryset=DeviceClass.objects.none(), empty_label=None)
    batch_size = forms.IntegerField(min_value=1, max_value=1024, initial=1)
    warmup_iterations = forms.IntegerField(min_value=0, max_value=10_000, initial=10)
    iterations = forms.IntegerField(min_value=1, max_value=1_000_000, initial=1000)

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["device_class"].queryset = DeviceClass.objects.filter(team=team)

    def params(self):
        data = self.cleaned_data
        return {key: data[key] for key in ("batch_size", "warmup_iterations", "iterations")}
