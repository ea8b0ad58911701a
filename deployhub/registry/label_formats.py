"""Read a task's labels from an image zip, in the formats teams already have them.

Boxes from a COCO json or YOLO txt files, masks from PNGs, strings from OCR lines; each
mapped from the image's pixels into the model input's with the version's resize and
center crop, as workers/checks/preprocessing.py maps the image. Numpy and Pillow only.
"""

import csv
import json
import math
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import numpy as np
from PIL import Image

from deployhub.registry.dataset_labels import LabelError, label_kind, plural
from workers.checks.preprocessing import validate_spec

MASK_MODES = {"1", "L", "P", "I", "I;16", "I;16B", "I;16L"}
YOLO_SLACK = 1e-3  # exporters round: 1.0004 is still a fraction of the image


def kinds_in_archive(root, images):
    """Return {kind: the file that shows it} for the labels an extracted image zip holds."""
    found = {}
    header = _csv_header(root / "labels.csv")
    if "label" in header:
        found["classes"] = "labels.csv with a label column"
    if "text" in header:
        found["texts"] = "labels.csv with a text column"
    if (root / "labels.txt").is_file():
        found["texts"] = "labels.txt"
    if coco := _coco_candidates(root):
        found["boxes"] = _relative(root, coco[0])
    elif where := _yolo_evidence(root, images):
        found["boxes"] = where
    if _mask_folder(root):
        found["masks"] = "masks/*.png"
    return found


def _csv_header(path):
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return [cell.strip().lower() for cell in next(csv.reader(handle), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []  # no labels.csv, or one datasets.py reports on when it reads it


def _relative(root, path):
    return path.relative_to(root).as_posix()


def _visible(paths):
    return sorted(p for p in paths if p.is_file() and not p.name.startswith("."))


def _coco_candidates(root):
    if (root / "annotations.json").is_file():
        return [root / "annotations.json"]
    return _visible(root.glob("*.json")) + _visible((root / "annotations").glob("*.json"))


def _yolo_evidence(root, images):
    if [p for p in _visible((root / "labels").rglob("*.txt")) if p.name != "classes.txt"]:
        return "YOLO labels/*.txt"
    if any(_beside(root, name).is_file() for name in images):
        return "YOLO .txt files beside the images"
    return ""


def _beside(root, name):
    return (root / name).with_suffix(".txt")


def _mask_folder(root):
    return any(p.suffix.lower() == ".png" for p in _visible((root / "masks").rglob("*")))


# -- Where an image's pixels land in the model input -------------------------------------


class Geometry(NamedTuple):
    """How an image maps into the model input: x_input = x_image * scale_x - left."""

    scale_x: float
    scale_y: float
    left: int
    top: int
    width: int
    height: int


def input_geometry(spec, width, height):
    """Return the Geometry of a width x height image under a preprocessing spec.

    As workers/checks/preprocessing.py does it: an optional stretch to the resize, then an
    optional center crop with its offsets rounded like torchvision's.
    """
    spec = validate_spec(spec)
    scale_x = scale_y = 1.0
    if resize := spec["resize"]:
        scale_x, scale_y = resize["width"] / width, resize["height"] / height
        width, height = resize["width"], resize["height"]
    left = top = 0
    if crop := spec["center_crop"]:
        top = int(round((height - crop["height"]) / 2.0))
        left = int(round((width - crop["width"]) / 2.0))
        width, height = crop["width"], crop["height"]
    return Geometry(scale_x, scale_y, left, top, width, height)


def boxes_to_input(boxes, geometry):
    """Map [k, 4] xyxy image-pixel boxes into the input; return (mapped, kept).

    A box is scaled, shifted by the crop and clipped to the input; one with nothing left
    inside (no width or no height) is dropped, and kept marks the boxes that remain.
    """
    g = geometry
    scale = np.array([g.scale_x, g.scale_y, g.scale_x, g.scale_y])
    shift = np.array([g.left, g.top, g.left, g.top], dtype=np.float64)
    mapped = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale - shift
    mapped = np.clip(mapped, 0.0, np.array([g.width, g.height, g.width, g.height], np.float64))
    kept = (mapped[:, 2] > mapped[:, 0]) & (mapped[:, 3] > mapped[:, 1])
    return mapped[kept].astype(np.float32), kept


def points_to_input(points, geometry):
    """Map [..., 3] (x, y, visibility) image-pixel keypoints into the input.

    A point that lands outside the input keeps its place but becomes invisible (0).
    """
    g = geometry
    points = np.asarray(points, dtype=np.float64)
    xy = points[..., :2] * [g.scale_x, g.scale_y] - [g.left, g.top]
    inside = (xy >= 0).all(axis=-1) & (xy[..., 0] <= g.width) & (xy[..., 1] <= g.height)
    visibility = np.where(inside, points[..., 2], 0.0)
    return np.concatenate([xy, visibility[..., None]], axis=-1).astype(np.float32)


def mask_to_input(mask, spec):
    """Resize (nearest) and crop a PIL mask exactly as the spec does its image."""
    spec = validate_spec(spec)
    if resize := spec["resize"]:
        mask = mask.resize((resize["width"], resize["height"]), Image.Resampling.NEAREST)
    if crop := spec["center_crop"]:
        top = int(round((mask.height - crop["height"]) / 2.0))
        left = int(round((mask.width - crop["width"]) / 2.0))
        mask = mask.crop((left, top, left + crop["width"], top + crop["height"]))
    return mask


# -- Labels in an image zip --------------------------------------------------------------


def archive_labels(root, task, images):
    """Read the labels of one kind from an extracted zip, before any image is decoded.

    images: the archive's images (relative paths, sorted). Returns an object with
    `names` (the samples' images, in order) and `targets(sizes, spec)`, which maps the
    labels into the model input once each image's (width, height) is known.
    """
    kind = label_kind(task)
    if kind == "texts":
        return TextLabels.read(root, images)
    if kind == "masks":
        return MaskLabels(root, images)
    if _coco_candidates(root):
        return read_coco(root, images)
    return read_yolo(root, task, images)


def _find_image(name, images, where):
    """Return the archive image a label file names: its path, else its unique file name."""
    name = name.strip().replace("\\", "/").removeprefix("./")
    if name in images.paths:
        return name
    matches = images.by_name.get(PurePosixPath(name).name, [])
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise LabelError(f"{where} names {name!r}, and the archive holds several images so named.")
    raise MissingImage(f"{where} names {name!r}, which is not an image in the archive.")


class MissingImage(LabelError):
    """A label names an image the archive does not hold."""


class ImageIndex:
    """The archive's images by relative path and by file name, to find what a label names."""

    def __init__(self, images):
        self.paths = set(images)
        self.by_name = {}
        for path in images:
            self.by_name.setdefault(PurePosixPath(path).name, []).append(path)


class BoxLabels:
    """Boxes (with their classes and any keypoints) per image, read from COCO or YOLO files.

    objects maps an image to its [(x1, y1, x2, y2), class, keypoints (flat x, y, v)];
    coordinates are image pixels, or fractions of the image when normalised (YOLO).
    """

    def __init__(self, names, objects, *, normalised, declared=None, notes=()):
        self.names, self.objects, self.normalised = names, objects, normalised
        self.declared, self.notes = declared or {}, list(notes)
        self.keypoints = _keypoint_count(objects)

    def targets(self, sizes, spec):
        """Return ({label array: values} in model-input pixels, notes for the summary)."""
        rows, dropped = [], 0
        for index, (name, size) in enumerate(zip(self.names, sizes, strict=True)):
            self._check_size(name, size)
            if objects := self.objects.get(name):
                boxes, classes, points = self._in_pixels(objects, size)
                kept = _mapped(boxes, classes, points, input_geometry(spec, *size))
                dropped += len(objects) - len(kept[0])
                rows.append((*kept, np.full(len(kept[0]), index, np.int64)))
        left_out = f"{plural(dropped, 'box', 'boxes')} outside the model input left out"
        notes = self.notes + ([left_out] if dropped else [])
        return self._stacked(rows, dropped), notes

    def _check_size(self, name, size):
        declared = self.declared.get(name)
        if declared and tuple(declared) != tuple(size):
            raise LabelError(
                f"{name!r} is {size[0]}x{size[1]} pixels but its annotation says "
                f"{declared[0]}x{declared[1]}; boxes are in the pixels of the image as stored."
            )

    def _in_pixels(self, objects, size):
        boxes = np.array([box for box, _, _ in objects], dtype=np.float64)
        classes = np.array([cls for _, cls, _ in objects], dtype=np.int64)
        points = np.zeros((len(objects), self.keypoints, 3))
        for row, (_, _, flat) in enumerate(objects):
            if flat:
                points[row] = np.reshape(flat, (-1, 3))
        if self.normalised:
            width, height = size
            boxes = boxes * [width, height, width, height]
            points = points * [width, height, 1.0]
        return boxes, classes, points

    def _stacked(self, rows, dropped):
        if not rows or not sum(len(row[0]) for row in rows):
            raise LabelError(
                "No box lies inside the model input after the resize and center crop "
                f"({plural(dropped, 'box', 'boxes')} left out)."
                if dropped
                else "The labels hold no boxes: every image is without objects."
            )
        boxes, classes, points, samples = (np.concatenate(part) for part in zip(*rows, strict=True))
        targets = {"label_boxes": boxes, "label_classes": classes, "label_sample": samples}
        if self.keypoints:
            targets["label_keypoints"] = points
        return targets


def _keypoint_count(objects):
    counts = {len(flat) // 3 for rows in objects.values() for _, _, flat in rows if flat}
    if len(counts) > 1:
        listed = ", ".join(map(str, sorted(counts)))
        raise LabelError(
            f"The objects carry different numbers of keypoints ({listed}); every object of a "
            "dataset has the same keypoints."
        )
    return counts.pop() if counts else 0


def _mapped(boxes, classes, points, geometry):
    mapped, kept = boxes_to_input(boxes, geometry)
    return mapped, classes[kept], points_to_input(points[kept], geometry)


def read_coco(root, images):
    """Read a COCO detection (or keypoints) json: boxes per image, classes by category id.

    Category ids become class indices 0..C-1 in id order (the model's class i is the i-th
    category by id). Images of the archive the json does not list have no objects;
    crowd annotations (iscrowd 1) are left out.
    """
    path = _coco_path(root)
    where = _relative(root, path)
    document = _load_json(path, where)
    index = ImageIndex(images)
    files, declared, absent = _coco_images(document, index, where)
    classes, names = _coco_categories(document, where)
    objects, crowds = _coco_annotations(document, files, classes, where, absent)
    listed = ", ".join(f"{i} {name}" for i, name in enumerate(names))
    notes = [f"class i is the i-th category by id: {listed}"]
    if absent:
        notes.insert(0, f"{plural(len(absent), 'listed image')} not in the archive left out")
    if crowds:
        notes.insert(0, f"{plural(crowds, 'crowd annotation')} left out")
    return BoxLabels(images, objects, normalised=False, declared=declared, notes=notes)


def _coco_path(root):
    candidates = _coco_candidates(root)
    if len(candidates) > 1:
        listed = ", ".join(_relative(root, p) for p in candidates)
        raise LabelError(
            f"The archive holds several .json files ({listed}); name the COCO file "
            "annotations.json."
        )
    return candidates[0]


def _load_json(path, where):
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LabelError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict) or not all(
        isinstance(document.get(key), list) for key in ("images", "annotations", "categories")
    ):
        raise LabelError(
            f"{where} is not COCO: it needs the lists images, annotations and categories."
        )
    return document


def _entry(item, keys, where, what):
    if not isinstance(item, dict) or any(key not in item for key in keys):
        raise LabelError(f"{where}: every {what} needs {', '.join(keys)}; one is {item!r:.80}.")
    if any(not isinstance(item[key], int | str) for key in keys if key.endswith("id")):
        raise LabelError(f"{where}: ids are numbers or strings; one {what} is {item!r:.80}.")
    return item


def _coco_images(document, index, where):
    """Return ({image id: archive path}, {path: declared size}, ids of images not in the zip).

    A COCO file may list more images than the zip holds (the whole val2017 beside a few of
    its images): those are left out with their annotations; none found is an error.
    """
    files, declared, seen, absent = {}, {}, set(), set()
    for item in document["images"]:
        item = _entry(item, ("id", "file_name"), where, "image")
        try:
            name = _find_image(str(item["file_name"]), index, where)
        except MissingImage:
            absent.add(item["id"])
            continue
        if name in seen:
            raise LabelError(f"{where} lists {name!r} twice.")
        files[item["id"]] = name
        seen.add(name)
        if isinstance(item.get("width"), int) and isinstance(item.get("height"), int):
            declared[name] = (item["width"], item["height"])
    if absent and not files:
        listed = plural(len(absent), "image")
        raise LabelError(f"{where} lists {listed} and none of them is in the archive.")
    return files, declared, absent


def _coco_categories(document, where):
    named = {}
    for item in document["categories"]:
        item = _entry(item, ("id",), where, "category")
        named[item["id"]] = str(item.get("name", item["id"]))
    try:
        ids = sorted(named)
    except TypeError as exc:
        raise LabelError(f"{where}: the category ids mix numbers and strings.") from exc
    if not ids:
        raise LabelError(f"{where} lists no categories.")
    return {cid: i for i, cid in enumerate(ids)}, [named[cid] for cid in ids]


def _coco_annotations(document, files, classes, where, absent=()):
    objects, crowds = {}, 0
    for item in document["annotations"]:
        item = _entry(item, ("image_id", "bbox", "category_id"), where, "annotation")
        if item["image_id"] in absent:
            continue
        if item.get("iscrowd"):
            crowds += 1
            continue
        if item["image_id"] not in files:
            raise LabelError(
                f"{where}: an annotation names image id {item['image_id']!r}, "
                "which is not in its images."
            )
        if item["category_id"] not in classes:
            raise LabelError(
                f"{where}: an annotation names category id "
                f"{item['category_id']!r}, which is not in its categories."
            )
        box = _coco_box(item["bbox"], where)
        points = _coco_points(item.get("keypoints") or [], where)
        objects.setdefault(files[item["image_id"]], []).append(
            (box, classes[item["category_id"]], points)
        )
    return objects, crowds


def _finite_numbers(values):
    return isinstance(values, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


def _coco_box(bbox, where):
    if not _finite_numbers(bbox) or len(bbox) != 4 or bbox[2] < 0 or bbox[3] < 0:
        raise LabelError(
            f"{where}: an annotation's bbox is {bbox!r:.80}; a COCO bbox is [x, y, width, "
            "height] in pixels."
        )
    x, y, width, height = bbox
    return (x, y, x + width, y + height)


def _coco_points(points, where):
    if not _finite_numbers(points) or len(points) % 3:
        raise LabelError(
            f"{where}: an annotation's keypoints are {points!r:.80}; COCO keypoints are "
            "x, y, visibility triples."
        )
    return tuple(points)


def read_yolo(root, task, images):
    """Read YOLO txt labels: one `class cx cy w h` line per object, fractions of the image.

    A keypoints task takes x y visibility triples after the box; an instance segmentation
    task also takes a polygon (class x1 y1 x2 y2 ...), whose bounding box is its box. An
    image without a label file has no objects.
    """
    objects = {}
    for name in images:
        path = _yolo_file(root, name)
        if path is not None:
            where = _relative(root, path)
            rows = _yolo_rows(path.read_bytes(), task, where)
            if rows:
                objects[name] = rows
    return BoxLabels(images, objects, normalised=True)


def _yolo_file(root, name):
    parts = PurePosixPath(name).parts
    candidates = [root / "labels" / Path(name).with_suffix(".txt").name, _beside(root, name)]
    folders = [i for i, part in enumerate(parts[:-1]) if part == "images"]
    if folders:  # images/a/b.jpg -> labels/a/b.txt, at the last images/ as Ultralytics does
        mirrored = PurePosixPath(*parts[: folders[-1]], "labels", *parts[folders[-1] + 1 :])
        candidates.insert(0, (root / mirrored).with_suffix(".txt"))
    return next((path for path in candidates if path.is_file()), None)


def _yolo_rows(data, task, where):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LabelError(f"{where} is not UTF-8 text.") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            rows.append(_yolo_row(line.split(), task, f"{where} line {number}"))
    return rows


def _yolo_row(fields, task, where):
    try:
        values = [float(field) for field in fields]
    except ValueError as exc:
        raise LabelError(f"{where}: {' '.join(fields)!r:.80} is not a list of numbers.") from exc
    if not all(math.isfinite(v) for v in values) or values[0] < 0 or values[0] % 1:
        raise LabelError(f"{where}: the class {fields[0]!r} is not a class index (0, 1, 2...).")
    box, points = _yolo_shape(values[1:], task, where)
    if any(v < -YOLO_SLACK or v > 1 + YOLO_SLACK for v in (*box, *points[0::3], *points[1::3])):
        raise LabelError(
            f"{where}: YOLO coordinates are fractions of the image, 0 to 1; these are "
            f"{' '.join(fields[1:5])!r:.60} (pixels?)."
        )
    cx, cy, w, h = box
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), int(values[0]), tuple(points)


def _yolo_shape(values, task, where):
    """Return ((cx, cy, w, h), keypoint triples) from a line's numbers after the class."""
    if len(values) == 4:
        if values[2] < 0 or values[3] < 0:
            raise LabelError(f"{where}: a box's width and height cannot be negative.")
        return values, []
    if task == "keypoints" and len(values) > 4 and (len(values) - 4) % 3 == 0:
        return values[:4], values[4:]
    if task == "instance_segmentation" and len(values) >= 6 and len(values) % 2 == 0:
        xs, ys = values[0::2], values[1::2]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
        return [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], []
    expected = {
        "keypoints": "'class cx cy w h' and then x y visibility for each keypoint",
        "instance_segmentation": "'class cx cy w h' or a polygon 'class x1 y1 x2 y2 x3 y3 ...'",
    }.get(task, "'class cx cy w h'")
    raise LabelError(f"{where}: a line is {expected}; this one has {len(values) + 1} numbers.")


class MaskLabels:
    """One PNG mask per image: masks/<image stem>.png, one class id per pixel."""

    def __init__(self, root, images):
        self.root, self.names = root, images
        self.paths = [_mask_file(root, name) for name in images]
        missing = [name for name, path in zip(images, self.paths, strict=True) if path is None]
        if missing:
            raise LabelError(
                f"{len(missing)} of {len(images)} images have no mask, the first {missing[0]!r}: "
                "each image needs masks/<image stem>.png."
            )

    def targets(self, sizes, spec):
        """Return ({"label_masks": [N, H, W]} at the model input's size, no notes)."""
        masks = [
            self._read(path, name, size, spec)
            for path, name, size in zip(self.paths, self.names, sizes, strict=True)
        ]
        masks = np.stack(masks)
        dtype = np.uint8 if masks.max() <= np.iinfo(np.uint8).max else np.int32
        return {"label_masks": masks.astype(dtype)}, []

    def _read(self, path, name, size, spec):
        where = _relative(self.root, path)
        with _open_mask(path, where) as mask:
            if mask.mode not in MASK_MODES:
                raise LabelError(
                    f"{where} is a {mask.mode} image; a mask holds one class id per pixel: save "
                    "it single-channel (mode L or P)."
                )
            if mask.size != tuple(size):
                raise LabelError(
                    f"{where} is {mask.width}x{mask.height} pixels but {name!r} is "
                    f"{size[0]}x{size[1]}; a mask has its image's size."
                )
            mask = mask.convert("I") if mask.mode.startswith("I") else mask
            array = np.asarray(mask_to_input(mask, spec))
        if array.min() < 0:
            raise LabelError(f"{where} holds negative class ids.")
        return array.astype(np.int32)


def _mask_file(root, name):
    parts = PurePosixPath(name).with_suffix(".png").parts
    candidates = [root / "masks" / parts[-1]]
    if parts[0] == "images" and len(parts) > 2:
        candidates.insert(0, root.joinpath("masks", *parts[1:]))
    return next((path for path in candidates if path.is_file()), None)


def _open_mask(path, where):
    try:
        mask = Image.open(path)
        mask.load()  # its size was checked against its image's, which passed the pixel cap
    except Exception as exc:  # Pillow's decoders raise many unrelated types
        raise LabelError(f"{where} could not be read as an image: {exc}") from exc
    return mask


class TextLabels:
    """The string each image shows: labels.txt (filename TAB text) or labels.csv (filename,text)."""

    def __init__(self, names, texts):
        self.names, self.texts = names, texts

    @classmethod
    def read(cls, root, images):
        """Read labels.txt, else labels.csv; every line names an image of the archive."""
        index = ImageIndex(images)
        if (root / "labels.txt").is_file():
            rows = _text_lines(_read_text(root / "labels.txt", "labels.txt"))
            where = "labels.txt"
        else:
            rows = _text_csv(_read_text(root / "labels.csv", "labels.csv"))
            where = "labels.csv"
        if not rows:
            raise LabelError(f"{where} lists no images.")
        names = [_find_image(name, index, f"{where} line {line}") for line, name, _ in rows]
        return cls(names, [text for _, _, text in rows])

    def targets(self, sizes, spec):
        """Return ({"label_texts": unicode [N]}, no notes): strings need no mapping."""
        return {"label_texts": np.array(self.texts, dtype=str)}, []


def _read_text(path, where):
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LabelError(f"{where} is not UTF-8 text.") from exc


def _text_lines(text):
    rows = []
    for line, content in enumerate(text.splitlines(), start=1):
        if not content.strip():
            continue
        if "\t" not in content:
            raise LabelError(
                f"labels.txt line {line}: a line is the image's file name, a tab, then its "
                "text; this one has no tab."
            )
        name, label = content.split("\t", 1)
        rows.append(_text_row(line, name, label, "labels.txt"))
    return rows


def _text_csv(text):
    reader = csv.reader(text.splitlines())
    header = [cell.strip().lower() for cell in next(reader, [])]
    if header != ["filename", "text"]:
        raise LabelError(f"labels.csv must start with the header filename,text; not {header}.")
    return [
        _text_row(reader.line_num, row[0], ",".join(row[1:]), "labels.csv") for row in reader if row
    ]


def _text_row(line, name, label, where):
    if not name.strip():
        raise LabelError(f"{where} line {line}: the file name is empty.")
    if not label:
        raise LabelError(f"{where} line {line}: {name.strip()!r} has no text.")
    return line, name.strip(), label
