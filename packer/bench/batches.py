"""The transforms, collate function and batch size of ``packer bench``.

What ``packer bench`` does to each sample and batch: the transform presets, the collate
function, and how big a batch is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from packer.errors import ConfigError

TRANSFORMS = ("none", "resize224", "imagenet")
"""Transform presets: ``none`` (the decoded HWC uint8 image), ``resize224`` (HWC uint8 resized
to 224x224), ``imagenet`` (shorter side 256, centre crop 224, CHW float32 normalised)."""


class Resize:
    """Resize an HWC image to ``size x size`` (OpenCV, bilinear)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """Return `image` resized to ``size x size``, always HWC."""
        import cv2

        out = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        return out if out.ndim == 3 else out[:, :, np.newaxis]


class ImagenetEval:
    """Shorter side to 256, centre crop 224, CHW float32 normalised with the ImageNet stats."""

    MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
    STD = np.array([0.229, 0.224, 0.225], np.float32) * 255

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """Return `image` as a normalised 224 x 224 CHW float32 centre crop."""
        import cv2

        h, w = image.shape[:2]
        scale = 256 / min(h, w)
        nh, nw = max(224, round(h * scale)), max(224, round(w * scale))
        image = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        if image.ndim == 2:
            image = image[:, :, np.newaxis]
        top, left = (nh - 224) // 2, (nw - 224) // 2
        crop = image[top : top + 224, left : left + 224].astype(np.float32)
        if crop.shape[2] == 3:
            crop = (crop - self.MEAN) / self.STD
        else:
            crop = (crop - self.MEAN.mean()) / self.STD.mean()
        return np.ascontiguousarray(crop.transpose(2, 0, 1))


def make_transform(name: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The transform preset `name` (one of :data:`TRANSFORMS`)."""
    if name == "none":
        return None
    if name == "resize224":
        return Resize(224)
    if name == "imagenet":
        return ImagenetEval()
    raise ConfigError(f"--transform {name!r}: expected one of {', '.join(TRANSFORMS)}")


def collate(batch: list[tuple[Any, Any]]) -> list[Any]:
    """Stack images of one shape into one array; keep a list when shapes differ (or bytes).

    Labels become an int64 array when they are all ints, else stay a list.
    """
    images = [s[0] for s in batch]
    labels = [s[1] for s in batch]
    first = images[0]
    out_images: Any = images
    if isinstance(first, np.ndarray) and all(
        isinstance(x, np.ndarray) and x.shape == first.shape and x.dtype == first.dtype
        for x in images
    ):
        out_images = np.stack(images)
    out_labels: Any = labels
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        out_labels = np.asarray(labels, dtype=np.int64)
    return [out_images, out_labels]


def batch_len(batch: Any) -> int:
    """Samples in a collated batch ``[images, labels]``."""
    images = batch[0] if isinstance(batch, list | tuple) else batch
    shape = getattr(images, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    return len(images)


def nbytes_of(obj: Any) -> int:
    """Bytes of the arrays, tensors and bytes in a (nested) batch."""
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, list | tuple):
        return sum(nbytes_of(x) for x in obj)
    if isinstance(obj, dict):
        return sum(nbytes_of(x) for x in obj.values())
    shape, size = getattr(obj, "shape", None), getattr(obj, "element_size", None)
    if shape is not None and callable(size):
        return int(math.prod(int(d) for d in shape)) * int(size())
    return 0
