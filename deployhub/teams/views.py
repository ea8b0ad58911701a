"""The account page: personal API tokens."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from deployhub.teams.models import ApiToken


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-upload.")


@login_required
def api_tokens(request):
    form = TokenForm()
    new_token = None
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            record = ApiToken(user=request.user, name=form.cleaned_data["name"])
            new_token = record.issue()
            record.save()
            form = TokenForm()
    tokens = request.user.api_tokens.all()
    return render(
        request, "teams/tokens.html", {"tokens": tokens, "form": form, "new_token": new_token}
    )


@login_required
@require_POST
def revoke_token(request, pk):
    record = get_object_or_404(ApiToken, pk=pk, user=request.user)
    record.delete()
    messages.success(request, f"Token {record.name} revoked.")
    return redirect("api_tokens")
