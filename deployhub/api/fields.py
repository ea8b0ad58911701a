"""What the request schemas of API v1 share: a person's text, a name, a required text, and
the body of a call that takes none.

Text is kept whole or refused, never cut (DEPLOYHUB_MAX_TEXT_CHARS, docs/api.md); a
required text that is blank counts as missing, so it is the same 400 ("Say 'reason': it
is required here.") as one left out.
"""

from typing import Annotated

from django.conf import settings
from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from deployhub.api.v1 import Strict

# A name or a slug: what the pages' forms and the models keep.
NAME_CHARS = 100


def said(value):
    """Return the text; a blank one is refused as a missing one."""
    if not value.strip():
        raise PydanticCustomError("missing", "Field required")
    return value


Text = Annotated[str, Field(max_length=settings.DEPLOYHUB_MAX_TEXT_CHARS)]
Name = Annotated[str, Field(max_length=NAME_CHARS)]
Required = Annotated[Text, AfterValidator(said)]
RequiredName = Annotated[Name, AfterValidator(said)]


class Nothing(Strict):
    """The body of a call that takes no field: {} or none at all; any field is refused."""
