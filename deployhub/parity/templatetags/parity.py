"""The parity section of the version page and the parity result on the job page."""

from django import template

from deployhub.devices.models import Device
from deployhub.parity.forms import ParityForm
from deployhub.parity.gates import parity_gate
from deployhub.parity.models import ParityRun
from workers.checks.parity import pack_format

register = template.Library()


@register.inclusion_tag("parity/_section.html", takes_context=True)
def parity_section(context):
    """Render the gate, the upload form and the runs of the page's version."""
    version = context["version"]
    classes = version.team.device_classes.all()
    # The runs first, then the gate: a run read while its job was unfinished is watched by
    # the page (data-live), which reloads when the job ends; a gate read first could miss
    # a run that finished between the two reads and stay "missing" with nothing watched.
    runs = list(ParityRun.objects.for_version(version)[:20])
    return {
        "version": version,
        "form": context.get("parity_form") or ParityForm(team=version.team),
        "runs": runs,
        "gate": parity_gate(version),
        "pack_format": pack_format(),
        "has_classes": classes.exists(),
        "worker_online": Device.objects.online()
        .filter(device_class__team=version.team, draining=False)
        .exists(),
        "role": context.get("role"),
        "csrf_token": context.get("csrf_token"),
    }


@register.inclusion_tag("parity/_job.html")
def parity_result(job):
    """Render what a parity job found, if it has a run."""
    return {"run": ParityRun.objects.filter(job=job).first(), "job": job}


@register.filter
def spec_line(spec):
    """Summarise a preprocessing spec on one line."""
    parts = []
    if resize := spec.get("resize"):
        parts.append(f"resize {resize['height']}×{resize['width']} {resize['interpolation']}")
    if crop := spec.get("center_crop"):
        parts.append(f"center crop {crop['height']}×{crop['width']}")
    parts += [spec.get("color_order", "RGB"), f"×{spec.get('scale', 1.0):.6g}"]
    if "mean" in spec:
        parts.append(f"mean {_numbers(spec['mean'])} std {_numbers(spec['std'])}")
    parts.append(f"{spec.get('layout', 'NCHW')} {spec.get('dtype', 'float32')}")
    return " · ".join(parts)


def _numbers(values):
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
