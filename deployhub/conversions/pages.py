"""What conversions adds to the version page (registered in apps.py): the class to convert on."""

from deployhub.conversions.forms import ConversionForm


def version_part(version):
    return {"conversion_form": ConversionForm(team=version.team)}
