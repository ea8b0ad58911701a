"""Load the demo team, users, device class and model; safe to run again."""

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
from django.contrib.auth import get_user_model
from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management.base import BaseCommand
from django.db import transaction

from deployhub.devices.models import Device, DeviceClass
from deployhub.parity.actions import submit_parity
from deployhub.registry.contract import batch_range_contract
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from deployhub.teams.models import Membership, Role, Team
from workers.backends.known import DEFAULT_BACKEND

ASSETS = Path(__file__).resolve().parents[2] / "assets"
LOCAL_CLASS = "local-cpu"
LOCAL_DEVICE = "local-worker"
CAST = [  # username, team slug, role
    ("alice", "demo", Role.ADMIN),
    ("bob", "demo", Role.REVIEWER),
    ("charlie", "acme", Role.ADMIN),
]


def demo_password():
    return os.environ.get("DEPLOYHUB_DEMO_PASSWORD", "deployhub-demo")


class Command(BaseCommand):
    help = "Create the demo team, users (alice, bob, charlie), class local-cpu and the demo model."

    def handle(self, *args, **options):
        with transaction.atomic():
            teams = self.seed_teams()
            self.seed_users(teams)
            device_class = self.seed_device_class(teams["demo"])
            self.seed_model(teams["demo"])
        self.stdout.write(f"Demo data ready: class {device_class.slug}, users alice/bob/charlie.")

    def seed_teams(self):
        names = {"demo": "Demo", "acme": "Acme Robotics"}
        return {
            slug: Team.objects.get_or_create(slug=slug, defaults={"name": name})[0]
            for slug, name in names.items()
        }

    def seed_users(self, teams):
        User = get_user_model()
        for username, team_slug, role in CAST:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(demo_password())
                user.save()
            Membership.objects.get_or_create(
                user=user, team=teams[team_slug], defaults={"role": role}
            )

    def seed_device_class(self, team):
        device_class, _ = DeviceClass.objects.get_or_create(
            slug=LOCAL_CLASS,
            defaults={
                "team": team,
                "name": "This machine's CPU",
                "description": "The local CPU worker that `make run` starts.",
                "frame_budget_ms": 33.3,
                "backends": [DEFAULT_BACKEND],
            },
        )
        if not device_class.devices.filter(name=LOCAL_DEVICE).exists():
            device = Device(device_class=device_class, name=LOCAL_DEVICE)
            device.issue_token()  # unknown to anyone: run_embedded issues a fresh one
            device.save()
        return device_class

    def seed_model(self, team):
        manifest = json.loads((ASSETS / "manifest.json").read_text())
        alice = get_user_model().objects.get(username="alice")
        model, _ = Model.objects.get_or_create(
            team=team,
            name=manifest["model"]["name"],
            defaults={"description": manifest["model"]["description"], "created_by": alice},
        )
        self.seed_versions(model, manifest, alice)
        self.seed_datasets(model, manifest, alice)
        self.seed_parity(model, alice)

    def seed_versions(self, model, manifest, alice):
        for entry in sorted(manifest["versions"], key=lambda v: v["version"]):
            if model.versions.filter(number=entry["version"]).exists():
                continue
            with open(ASSETS / entry["file"], "rb") as handle:
                create_version(
                    model,
                    File(handle, name=entry["file"]),
                    alice,
                    notes=entry.get("notes", ""),
                    preprocessing=manifest.get("preprocessing"),
                    contract=batch_range_contract("image", (3, 32, 32)),
                )

    def seed_datasets(self, model, manifest, alice):
        """Attach the demo's calibration and validation sets, checked against the latest version."""
        version = model.latest_version()
        for kind, filename in manifest["datasets"].items():
            if model.datasets.filter(name=kind).exists():
                continue
            with open(ASSETS / filename, "rb") as handle:
                create_dataset(version, File(handle, name=filename), alice, kind=kind, name=kind)

    def seed_parity(self, model, alice):
        """Check the latest version's preprocessing against the demo's training tensors.

        The samples folder holds the raw images and the tensors the training pipeline fed
        the model for them: zipped as a parity pack (one tensor per image, named by its
        stem), its parity job runs on the local worker, so the demo's engines can pass
        all four release gates.
        """
        version = model.latest_version()
        if version.parity_runs.exists():
            return
        samples = ASSETS / "samples"
        fed = np.load(samples / "tensors.npz", allow_pickle=False)
        tensors = io.BytesIO()
        np.savez(
            tensors, **{Path(n).stem: x for n, x in zip(fed["names"], fed["inputs"], strict=True)}
        )
        pack = io.BytesIO()
        with zipfile.ZipFile(pack, "w") as archive:
            for name in fed["names"]:
                archive.write(samples / name, name)
            archive.writestr("tensors.npz", tensors.getvalue())
        submit_parity(version, SimpleUploadedFile("parity-pack.zip", pack.getvalue()), alice)
