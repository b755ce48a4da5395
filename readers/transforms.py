"""Transforms planned before decoding, so that JPEGs decode at a reduction.

Transforms planned before decoding: the dataset gives the transform the image's size (from
the index), the transform draws its crop and the JPEG reduction it can afford, and only then
is the image decoded (at that reduction), cropped and resized.

The protocol (`DecodePlanner`): a dataset whose ``transform`` has ``plan`` and ``apply`` calls
``plan(height, width)`` with the size of the image as it will be returned (the index's stored
size, height and width swapped for EXIF orientations 5-8), decodes a JPEG at
``1 / plan.scale`` and calls ``apply(image, plan)``. Records that are not JPEGs, and datasets
without an index, are decoded at full size and the transform is called as any other,
``transform(image)``, which plans from the image itself: the result is then exactly what the
usual transform gives.
A planner whose ``plan`` takes a keyword ``rng`` is given the sample's generator
(`readers.augment_rng`) in ``plan`` and in ``apply`` and ``__call__`` where they take it.

`RandomResizedCropDraft` is paddle.vision's ``RandomResizedCrop`` planned this way: the same
boxes from the same random state, drawn from the index's size instead of the decoded image.

`ResizeTo` is the plain transform a first training loop needs: every image to one fixed
``(height, width)``, stretched or with its aspect kept and padded, so that the DataLoader's
default collate can stack images of mixed sizes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import cv2
import numpy as np

from readers.augment_rng import REQUIRED, rng_kwargs, rng_use
from readers.draft import crop_scale, scaled_size

__all__ = [
    "DecodePlan",
    "DecodePlanner",
    "PlannedImage",
    "RandomResizedCropDraft",
    "ResizeTo",
    "is_planner",
    "run_transform",
]

INTERPOLATIONS = {
    # as paddle.vision.transforms.functional_cv2.resize names them
    "nearest": cv2.INTER_NEAREST,
    "bilinear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "bicubic": cv2.INTER_CUBIC,
    "lanczos": cv2.INTER_LANCZOS4,
}


@dataclass(frozen=True)
class DecodePlan:
    """What a planner decided for one image before it was decoded.

    Attributes:
        height: height of the image as returned at full size (after EXIF orientation).
        width: its width.
        scale: the JPEG reduction to decode at: 1, 2, 4 or 8.
        box: ``(top, left, box_height, box_width)`` of the crop, in full-size pixels.
    """

    height: int
    width: int
    scale: int
    box: tuple[int, int, int, int]

    def scale_of(self, image: np.ndarray) -> int:
        """Return the reduction `image` was decoded at.

        The reduction `image` was decoded at: `scale` when its size is the scaled size,
        1 when it is the full size.

        Raises:
            ValueError: `image` has neither size (it is not the image planned for).
        """
        got = tuple(image.shape[:2])
        if got == (self.height, self.width):
            return 1
        if got == scaled_size(self.height, self.width, self.scale):
            return self.scale
        raise ValueError(
            f"an image of {got[0]}x{got[1]} for a plan of {self.height}x{self.width} at "
            f"1/{self.scale}; expected {self.height}x{self.width} or "
            f"{'x'.join(map(str, scaled_size(self.height, self.width, self.scale)))}"
        )


@runtime_checkable
class DecodePlanner(Protocol):
    """A transform that decides before decoding (see the module docstring)."""

    def plan(self, height: int, width: int) -> DecodePlan:
        """The plan for an image of `height` x `width` (as returned at full size)."""
        ...

    def apply(self, image: np.ndarray, plan: DecodePlan) -> Any:
        """The transformed image, from `image` decoded at full size or at ``plan.scale``."""
        ...

    def __call__(self, image: np.ndarray) -> Any:
        """Plan from the image's own size and apply (an image decoded at full size)."""
        ...


@dataclass(frozen=True)
class PlannedImage:
    """A decoded image with the plan it was decoded for, on its way to ``transform.apply``."""

    image: np.ndarray
    plan: DecodePlan


def is_planner(transform: Any) -> bool:
    """Whether `transform` plans before decoding (has callable ``plan`` and ``apply``)."""
    return callable(getattr(transform, "plan", None)) and callable(
        getattr(transform, "apply", None)
    )


def run_transform(
    transform: Callable[..., Any], image: Any, rng: np.random.Generator | None = None
) -> Any:
    """``transform.apply(image, plan)`` for a `PlannedImage`, else ``transform(image)``.

    With `rng`, passed as ``rng=rng`` to whichever of them takes it (`readers.augment_rng`).
    """
    if isinstance(image, PlannedImage):
        apply = transform.apply  # type: ignore[attr-defined]
        return apply(image.image, image.plan, **rng_kwargs(apply, rng))
    return transform(image, **rng_kwargs(transform, rng))


def _pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{name}={size!r}: expected a positive int or (height, width)")
    return int(pair[0]), int(pair[1])


def _cut(image: np.ndarray, box: tuple[int, int, int, int], scale: int) -> np.ndarray:
    """Cut the full-size `box` out of `image` decoded at ``1/scale``.

    The full-size `box` out of `image` decoded at ``1/scale``: a patch of the box's size
    in reduced pixels, centred where the box's centre falls (sub-pixel, bilinear) where
    OpenCV can (8-bit, 1 or 3 channels), else the box rounded to reduced pixels.
    """
    top, left, h, w = box
    size = (max(1, round(w / scale)), max(1, round(h / scale)))
    channels = 1 if image.ndim == 2 else image.shape[2]
    if image.dtype == np.uint8 and channels in (1, 3):
        centre = ((left + w / 2) / scale - 0.5, (top + h / 2) / scale - 0.5)
        patch = cv2.getRectSubPix(image, size, centre)
        return patch if patch.ndim == image.ndim else patch[:, :, np.newaxis]
    y0, x0 = round(top / scale), round(left / scale)
    return image[y0 : y0 + size[1], x0 : x0 + size[0]]


class RandomResizedCropDraft:
    """paddle.vision's ``RandomResizedCrop``, with the crop drawn before decoding.

    The box follows ``RandomResizedCrop._dynamic_get_param`` step for step, with the same
    random sources (numpy's global ``np.random`` for the area and the log-uniform aspect
    ratio, Python's ``random`` for the position; paddle's DataLoader seeds both in each
    worker), so a given random state gives the same box as paddle's transform on the image
    decoded at full size. The JPEG is then decoded at the largest reduction (1/8, 1/4, 1/2) at
    which the box still has at least `size` pixels, and the box is cut from the reduced image
    and resized to `size`. Without a reduction the output is byte-identical to paddle's
    (crop, then ``cv2.resize``); with one it differs by the DCT scaling (the reduced image is
    an average of each ``s x s`` block; tested to stay above 30 dB PSNR on smooth images).

    Given ``rng=`` (a ``numpy.random.Generator``: datasets and ``ShardStream`` pass one per
    sample when they know the sampler's seed and epoch, see `readers.augment_rng`), it draws
    the box from that generator instead, and passes it on to `then` when `then` takes
    ``rng``: the crop then depends on the seed, the epoch and the sample only, not on the
    worker, the number of ranks or where a run resumed.

    When it helps: photos several times larger than `size` (a 1900 x 1200 photo decodes in
    about a third of the time at 1/4), where most boxes are at least twice `size`. When it
    cannot: images under twice `size` on a side (the box never affords a reduction, so the
    decode is full; the plan costs a few microseconds), small boxes (scale near 0.08: a box
    of 0.08 of a 1000 x 1000 image is 283 pixels, too small for 1/2 at 224), records that are
    not JPEGs, and datasets without an index (all decoded at full size, the output the same
    as paddle's).

    Args:
        size: output ``(height, width)``, or one int for both.
        scale: range of the box's area as a fraction of the image's.
        ratio: range of the box's aspect ratio (width / height), drawn log-uniformly.
        interpolation: ``nearest``, ``bilinear`` (default), ``area``, ``bicubic`` or
            ``lanczos``, as paddle's cv2 backend names them.
        then: applied to the cropped image (for example a paddle ``Compose`` of flips and
            normalisation, or a function taking ``rng`` as a keyword); a planner must be the
            dataset's transform itself, so compose the rest here rather than wrapping this
            transform in a ``Compose``.

    Example::

        from readers import LmdbDataset
        from readers.transforms import RandomResizedCropDraft

        ds = LmdbDataset("train.lmdb", transform=RandomResizedCropDraft(224))
    """

    attempts = 10

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4, 4.0 / 3),
        interpolation: str = "bilinear",
        *,
        then: Callable[[Any], Any] | None = None,
    ) -> None:
        self.size = _pair(size, "size")
        if not (len(scale) == 2 and 0 < scale[0] <= scale[1]):
            raise ValueError(f"scale={scale!r}: expected (min, max) with 0 < min <= max")
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio={ratio!r}: expected (min, max) with 0 < min <= max")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation={interpolation!r}: expected one of {', '.join(INTERPOLATIONS)}"
            )
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation
        self.then = then

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"interpolation={self.interpolation!r})"
        )

    def box(
        self, height: int, width: int, *, rng: np.random.Generator | None = None
    ) -> tuple[int, int, int, int]:
        """Draw ``(top, left, box_height, box_width)`` as ``RandomResizedCrop`` does.

        ``(top, left, box_height, box_width)`` drawn as paddle's ``RandomResizedCrop``
        draws it for an image of `height` x `width`; from `rng` when given, else from the
        global generators paddle draws from.
        """
        area = height * width
        # without rng, numpy's global generator, not a Generator: it is what paddle draws
        # from and what its DataLoader seeds in each worker
        uniform = np.random.uniform if rng is None else rng.uniform
        for _ in range(self.attempts):
            target_area = uniform(*self.scale) * area
            log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
            aspect_ratio = math.exp(uniform(*log_ratio))
            w = round(math.sqrt(target_area * aspect_ratio))
            h = round(math.sqrt(target_area / aspect_ratio))
            if 0 < w <= width and 0 < h <= height:
                if rng is None:
                    return random.randint(0, height - h), random.randint(0, width - w), h, w
                top, left = (int(v) for v in rng.integers(0, (height - h + 1, width - w + 1)))
                return top, left, h, w
        # fallback: the central crop, its aspect ratio clamped to the range
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w = width
            h = round(w / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h = height
            w = round(h * max(self.ratio))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def plan(
        self, height: int, width: int, *, rng: np.random.Generator | None = None
    ) -> DecodePlan:
        """Draw the box for an image of `height` x `width` and the reduction it affords.

        From `rng` when given, else from the global generators (see the class docstring).
        """
        top, left, h, w = self.box(height, width, rng=rng)
        scale = crop_scale(h, w, *self.size)
        return DecodePlan(height=height, width=width, scale=scale, box=(top, left, h, w))

    def apply(
        self, image: np.ndarray, plan: DecodePlan, *, rng: np.random.Generator | None = None
    ) -> Any:
        """Cut ``plan.box`` out of `image`, resize it to `size`, then apply `then`.

        Cut ``plan.box`` out of `image` (decoded at full size or at ``plan.scale``) and
        resize it to `size`, then `then` (given `rng` when it takes ``rng``).

        Raises:
            ValueError: `image` is not of the size planned for.
        """
        scale = plan.scale_of(image)
        top, left, h, w = plan.box
        out_h, out_w = self.size
        flags = INTERPOLATIONS[self.interpolation]
        if scale == 1:  # what paddle's functional_cv2.crop + resize do
            cut = image[top : top + h, left : left + w]
            out = cv2.resize(cut, (out_w, out_h), None, 0, 0, flags)
        elif self.interpolation == "area":  # no area warp: cut the box out, then resize
            out = cv2.resize(_cut(image, plan.box, scale), (out_w, out_h), None, 0, 0, flags)
        else:
            # Output pixel x samples full-size x_f = left + (x + 0.5) * w / out_w - 0.5 (as
            # cv2.resize maps pixel centres); reduced pixel k covers full pixels
            # [k * s, (k + 1) * s), so x_f lies at reduced (x_f + 0.5) / s - 0.5.
            sx, sy = w / out_w, h / out_h
            matrix = np.array(
                [
                    [sx / scale, 0.0, (left + 0.5 * sx) / scale - 0.5],
                    [0.0, sy / scale, (top + 0.5 * sy) / scale - 0.5],
                ]
            )
            out = cv2.warpAffine(
                image,
                matrix,
                (out_w, out_h),
                flags=flags | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_REPLICATE,
            )
        if image.ndim == 3 and out.ndim == 2:
            out = out[:, :, np.newaxis]
        if self.then is None:
            return out
        if rng is None and rng_use(self.then) == REQUIRED:  # drawn, as the box, from np.random
            rng = np.random.default_rng(np.random.randint(2**62))  # noqa: NPY002
        return self.then(out, **rng_kwargs(self.then, rng))

    def __call__(self, image: np.ndarray, *, rng: np.random.Generator | None = None) -> Any:
        """Crop and resize an image decoded at full size: paddle's ``RandomResizedCrop``.

        From `rng` when given, else from the global generators (see the class docstring).
        """
        plan = self.plan(int(image.shape[0]), int(image.shape[1]), rng=rng)
        return self.apply(image, plan, **rng_kwargs(self.apply, rng))  # a subclass's may not


class ResizeTo:
    """Resize an HxWxC (or HxW) image to exactly ``(height, width)``, with OpenCV.

    With ``keep_aspect=False`` (default) the image is stretched to the size. With
    ``keep_aspect=True`` it is scaled by the largest factor that fits it inside the size
    (up or down), placed at the top left, and the rest is filled with `pad_value` (at the
    right and bottom, where an OCR model expects padding). The dtype and the number of
    channels are kept (a HxWx1 image stays HxWx1), so the output of every sample has the same
    shape and ``paddle.io.DataLoader``'s default collate stacks them.

    Args:
        size: output ``(height, width)``, or one int for a square.
        keep_aspect: scale without distortion and pad, instead of stretching.
        pad_value: the fill of the padding (``keep_aspect=True``).
        interpolation: ``nearest``, ``bilinear`` (default), ``area``, ``bicubic`` or
            ``lanczos``, as paddle's cv2 backend names them.

    Raises:
        ValueError: a size that is not positive, or an unknown interpolation.

    Example::

        ds = LmdbDataset("out.lmdb", transform=ResizeTo((32, 32)))  # images 32x32x3
    """

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        keep_aspect: bool = False,
        pad_value: int | float = 0,
        interpolation: str = "bilinear",
    ) -> None:
        self.size = _pair(size, "size")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation={interpolation!r}: expected one of {', '.join(INTERPOLATIONS)}"
            )
        self.keep_aspect = bool(keep_aspect)
        self.pad_value = pad_value
        self.interpolation = interpolation

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, keep_aspect={self.keep_aspect}, "
            f"pad_value={self.pad_value!r}, interpolation={self.interpolation!r})"
        )

    def fitted_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` an image of `height` x `width` is scaled to before padding.

        The whole size without ``keep_aspect``; with it, the largest of the image's aspect
        that fits (each side at least 1 pixel).
        """
        out_h, out_w = self.size
        if not self.keep_aspect:
            return out_h, out_w
        factor = min(out_h / height, out_w / width)
        return (
            min(out_h, max(1, round(height * factor))),
            min(out_w, max(1, round(width * factor))),
        )

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """The image resized (and padded) to `size`; see the class docstring."""
        if not isinstance(image, np.ndarray) or image.ndim not in (2, 3) or image.size == 0:
            what = image.shape if isinstance(image, np.ndarray) else type(image).__name__
            raise ValueError(
                f"ResizeTo takes an HxW or HxWxC numpy image, got {what}; put it before "
                "transforms that make tensors or CHW arrays"
            )
        height, width = int(image.shape[0]), int(image.shape[1])
        fit_h, fit_w = self.fitted_size(height, width)
        flags = INTERPOLATIONS[self.interpolation]
        if (fit_h, fit_w) == (height, width):
            resized = image
        else:
            resized = cv2.resize(image, (fit_w, fit_h), None, 0, 0, flags)
            if image.ndim == 3 and resized.ndim == 2:  # OpenCV drops a single channel
                resized = resized[:, :, np.newaxis]
        if (fit_h, fit_w) == self.size:
            return resized
        out = np.full((*self.size, *image.shape[2:]), self.pad_value, dtype=image.dtype)
        out[:fit_h, :fit_w] = resized
        return out
