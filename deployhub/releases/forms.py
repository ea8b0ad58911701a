from django import forms

from deployhub.releases.models import Decision


class ProposeForm(forms.Form):
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        help_text="Why this engine, for reviewers.",
    )


class ReviewForm(forms.Form):
    decision = forms.ChoiceField(choices=Decision.choices())
    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class RollbackForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))


class OverrideForm(forms.Form):
    gate = forms.CharField(max_length=30)
    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))
