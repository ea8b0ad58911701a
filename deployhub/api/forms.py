"""The pages' forms checking an API v1 call's fields: their refusals as one 400."""

from deployhub.api.auth import BadInput


def check_form(form, what, prefix=""):
    """Raise BadInput ("<what>: '<field>': <why>; ...") unless the form is valid: the same
    checks and words as the page that uses the form, each naming its field (prefix first)."""
    if form.is_valid():
        return
    problems = "; ".join(
        f"{'' if name == '__all__' else repr(prefix + name) + ': '}{' '.join(errors)}"
        for name, errors in form.errors.items()
    )
    raise BadInput(f"{what}: {problems}")
