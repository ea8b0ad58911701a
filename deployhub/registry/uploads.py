"""Turn an uploaded file into a stored, validated ModelVersion, or nothing at all.

Uploads stream to a temporary file inside the storage root, hashed as they
arrive (HashingUploadHandler); validation runs on that file; only a valid
file is moved to its content-addressed name (the store: deployhub/core/store.py),
in the transaction that creates the version. Whatever fails, the temporary files go.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import TemporaryUploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.db import IntegrityError, transaction

from deployhub.core.store import CHUNK, placed, placing, workspace
from deployhub.registry.archives import RatioCap, check_filename, sniff
from deployhub.registry.contract import (
    ContractError,
    contract_warnings,
    default_contract,
    validate_contract,
)
from deployhub.registry.datasets import STORED, DatasetError
from deployhub.registry.inspect import InvalidModel, UploadTooLarge
from deployhub.registry.models import (
    Dataset,
    DatasetKind,
    Model,
    ModelVersion,
    dataset_upload_path,
    version_upload_path,
)
from deployhub.registry.tasks import proposed_task
from deployhub.registry.validate import validate_in_child
from deployhub.teams.models import Event
from workers.checks.preprocessing import SpecError, validate_spec


class DuplicateVersion(InvalidModel):
    """The same file is already a version of this model."""

    def __init__(self, version):
        self.version = version
        super().__init__(f"This file is already {version} (same sha256); nothing was stored.")


class SpecRefused(InvalidModel):
    """The preprocessing spec is invalid: the page shows it next to the spec."""


class ContractRefused(InvalidModel):
    """The input-shape contract does not fit the model's inputs: shown next to the contract."""


class DuplicateModelName(ValueError):
    """The team already has a model of that name."""


class HashedUploadedFile(TemporaryUploadedFile):
    """An upload on disk in the storage root's tmp folder, with its sha256 taken on the way."""

    def __init__(self, *args, limit, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.digest = hashlib.sha256()
        self.received = 0
        self.oversized = False

    def receive(self, chunk):
        """Write and hash a chunk; past the limit keep counting but store nothing."""
        self.received += len(chunk)
        if self.oversized:
            return
        if self.received > self.limit:
            self.oversized = True
            self.file.truncate(0)
            return
        self.digest.update(chunk)
        self.file.write(chunk)

    @property
    def sha256(self):
        return self.digest.hexdigest()


class HashingUploadHandler(FileUploadHandler):
    """Stream every uploaded file to disk, hashing it; the web process never holds it."""

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.file = HashedUploadedFile(
            self.file_name,
            self.content_type,
            0,
            self.charset,
            self.content_type_extra,
            limit=settings.DEPLOYHUB_MAX_UPLOAD_BYTES,
        )

    def receive_data_chunk(self, raw_data, start):
        with self.discarded_on_error():
            self.file.receive(raw_data)

    def file_complete(self, file_size):
        with self.discarded_on_error():
            self.file.seek(0)  # flushes: a full disk may say so only now
        self.file.size = self.file.received
        return self.file

    @contextmanager
    def discarded_on_error(self):
        """Delete the temporary file now when writing it fails (a full disk): nothing stays
        half-written in the storage root."""
        try:
            yield
        except OSError:
            with contextlib.suppress(OSError):
                self.file.close()  # the temporary file deletes itself on close
            raise

    def upload_interrupted(self):
        if getattr(self, "file", None) is not None:
            self.file.close()


def check_size(uploaded_file):
    """Refuse an upload over the size cap, with the cap in the message."""
    limit = settings.DEPLOYHUB_MAX_UPLOAD_BYTES
    if getattr(uploaded_file, "oversized", False) or uploaded_file.size > limit:
        raise UploadTooLarge(f"The file is larger than the upload limit of {limit:,} bytes.")


@contextmanager
def received(uploaded_file):
    """Yield (path, sha256, size) of the upload on disk; the path is gone afterwards."""
    check_size(uploaded_file)
    if isinstance(uploaded_file, HashedUploadedFile):
        try:
            yield (
                Path(uploaded_file.temporary_file_path()),
                uploaded_file.sha256,
                uploaded_file.size,
            )
        finally:
            uploaded_file.close()  # deletes the temporary file unless it was moved into place
        return
    path, sha256, size = spool(uploaded_file)
    try:
        yield path, sha256, size
    finally:
        path.unlink(missing_ok=True)


def spool(uploaded_file):
    """Copy a file object into the storage root's tmp folder, hashing it."""
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=settings.FILE_UPLOAD_TEMP_DIR, suffix=".upload")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in uploaded_file.chunks(CHUNK):
                size += len(chunk)
                if size > settings.DEPLOYHUB_MAX_UPLOAD_BYTES:
                    raise UploadTooLarge("The file is larger than the upload limit.")
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name), digest.hexdigest(), size


def head(path, size=512):
    with open(path, "rb") as handle:
        return handle.read(size)


def ratio_cap():
    """Return the compression-ratio cap every uploaded archive unpacks under (settings)."""
    return RatioCap(settings.DEPLOYHUB_MAX_UNPACK_RATIO, settings.DEPLOYHUB_UNPACK_ALLOWANCE_BYTES)


def read_in_child(kind, path, work, params, *, refusal=InvalidModel, module=None):
    """Read an upload in the capped child process (validate.py); return its small answer.

    Adds what every kind gets: the size cap and the compression-ratio cap of archives.
    module serves the kind (`python -m`): validate.py unless an app above serves its own.
    """
    params = {
        "max_total_bytes": settings.DEPLOYHUB_MAX_UPLOAD_BYTES,
        **params,
        "cap": dataclasses.asdict(ratio_cap()),
    }
    return validate_in_child(
        kind,
        path,
        work,
        params=params,
        memory_mb=settings.DEPLOYHUB_VALIDATION_MEMORY_MB,
        timeout=settings.DEPLOYHUB_VALIDATION_TIMEOUT,
        refusal=refusal,
        module=module,
    )


def inspect_upload(path, kind):
    """Validate a received file of a sniffed kind, in a child process, and describe it."""
    with workspace() as work:
        return read_in_child(kind, path, work, {})


def check_spec_and_contract(info, preprocessing, contract):
    """Return the validated spec and contract for a version, or raise InvalidModel."""
    try:
        spec = validate_spec(preprocessing) if preprocessing else {}
    except SpecError as exc:
        raise SpecRefused(f"Preprocessing spec: {exc}") from exc
    proposed = contract or default_contract(info["inputs"])
    try:
        return spec, validate_contract(proposed, info["inputs"])
    except ContractError as exc:
        hint = (
            ""
            if contract
            else (
                " The model leaves these dims open: upload it with an input-shape contract that "
                f"fills in min, opt and max, starting from {json.dumps(proposed)}"
            )
        )
        raise ContractRefused(f"Contract: {exc}{hint}") from exc


def create_model(team, user, *, name, uploaded_file, description="", **version_fields):
    """Create a model and its first version together, or nothing (the page and the API call this).

    Raises DuplicateModelName, or InvalidModel (UploadTooLarge) for the file;
    version_fields are create_version's notes, preprocessing and contract.
    """
    try:
        with transaction.atomic():
            model = Model.objects.create(
                team=team, name=name, description=description, created_by=user
            )
            version = create_version(model, uploaded_file, user, **version_fields)
    except IntegrityError as exc:
        raise DuplicateModelName(f"{team} already has a model named {name!r}.") from exc
    return model, version


def create_version(model, uploaded_file, user, *, notes="", preprocessing=None, contract=None):
    """Validate and store an uploaded model file as the model's next version."""
    filename = check_filename(Path(uploaded_file.name or "").name or "")
    with received(uploaded_file) as (path, sha256, size):
        kind = sniff(filename, head(path))
        if existing := model.versions.filter(sha256=sha256).first():
            raise DuplicateVersion(existing)
        info = inspect_upload(path, kind)
        spec, contract = check_spec_and_contract(info, preprocessing, contract)
        version = ModelVersion(
            model=model,
            sha256=sha256,
            size=size,
            original_filename=filename,
            notes=notes,
            preprocessing=spec,
            contract=contract,
            created_by=user,
            warnings=contract_warnings(contract, info["inputs"], gpu=False),
            task=proposed_task(info),
            **{key: value for key, value in info.items() if key in VERSION_FIELDS},
        )
        return save_version(version, path)


VERSION_FIELDS = {
    "format",
    "ir_version",
    "opset",
    "producer",
    "inputs",
    "outputs",
    "graph",
    "external_data",
}


def save_version(version, path, move=True):
    """Number, store and save a validated version; remove its file if the save fails."""
    version.file.name = version_upload_path(version, "")  # its bytes' name, not its number's
    with placing(version.file.name) as put:
        # The model's row is the lock: two uploads at once must not take the same number.
        Model.objects.select_for_update().filter(pk=version.model_id).first()
        version.number = version.model.next_version_number()
        if path is not None:  # None: a derived version shares its source's file
            put(path, move=move)
        version.save()
        Event.record(
            version.team,
            version.created_by,
            "version.created",
            version,
            sha256=version.sha256,
            format=version.format,
            before=None,
            after=f"v{version.number} stored",
        )
    return version


def derive_version(source, user, *, notes="", preprocessing=None, contract=None):
    """Make a new version of the same file with another spec or contract (versions never change)."""
    spec, contract = check_spec_and_contract(
        {"inputs": source.inputs}, preprocessing, contract or source.contract
    )
    if spec == source.preprocessing and contract == source.contract:
        raise InvalidModel("Nothing changed: the spec and the contract are those of this version.")
    version = ModelVersion(
        model=source.model,
        sha256=source.sha256,
        size=source.size,
        format=source.format,
        original_filename=source.original_filename,
        ir_version=source.ir_version,
        opset=source.opset,
        producer=source.producer,
        inputs=source.inputs,
        outputs=source.outputs,
        graph=source.graph,
        external_data=source.external_data,
        preprocessing=spec,
        contract=contract,
        task=source.task,
        parent=source,
        notes=notes,
        created_by=user,
        warnings=contract_warnings(contract, source.inputs, gpu=False),
    )
    return save_version(version, None)


def create_dataset(version, uploaded_file, user, *, kind, name):
    """Check a calibration or validation dataset against the version and store it as .npz.

    The file is read in the capped child process (validate.py), which writes the checked
    samples into the work folder; only that file and its description come back here. Its
    labels are those of the version's task (a classifier's when it declares none).
    """
    filename = check_filename(Path(uploaded_file.name or "").name or "")
    if version.model.datasets.filter(name=name).exists():
        raise DatasetError(f"{version.model} already has a dataset named {name!r}.")
    with received(uploaded_file) as (path, source_sha256, _), workspace() as work:
        params = {
            "filename": filename,
            "require_labels": kind == DatasetKind.VALIDATION,
            "inputs": version.inputs,
            "contract": version.contract,
            "preprocessing": version.preprocessing,
            "task": (version.task or {}).get("task") or "classification",
            "max_bytes": settings.DEPLOYHUB_MAX_UPLOAD_BYTES,
        }
        facts = read_in_child("dataset", path, work, params, refusal=DatasetError)
        dataset = Dataset(
            model=version.model,
            kind=kind,
            name=name,
            original_filename=filename,
            source=facts["source"],
            source_sha256=source_sha256,
            sha256=facts["sha256"],
            size=facts["size"],
            samples=facts["samples"],
            input_shape=facts["input_shape"],
            input_dtype=facts["input_dtype"],
            has_labels=facts["labels"],
            classes=facts["classes"],
            task=facts["task"],
            label_summary=facts["label_summary"],
            checked_against=version,
            created_by=user,
        )
        dataset.file.name = dataset_upload_path(dataset, "")
        with placed(work / STORED, dataset.file.name):
            dataset.save()
            Event.record(version.team, user, "dataset.created", dataset, kind=kind, after="stored")
    return dataset
