"""Batches of images of different sizes: padded to the largest in the batch, sizes kept.

`PadCollate` (and `pad_collate`, its default instance) is a ``collate_fn`` for
``paddle.io.DataLoader``: it stacks a batch of ``(image, label)`` samples whose images differ
in height and width into one ``N x H_max x W_max x C`` array, the images at the top left and
the rest filled with a pad value, and returns each image's own width (and height) beside it, so
that a model (an OCR recogniser's CTC lengths, a detector's valid area) knows where the padding
starts. It returns numpy arrays, which the DataLoader turns into tensors, and pickles (a
module-level class), so it works with ``num_workers`` under ``fork`` and ``spawn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = ["LAYOUTS", "PadCollate", "collate_labels", "pad_collate"]

LAYOUTS = ("HWC", "CHW")
"""Image layouts `PadCollate` pads: channels last (what datasets return) or first."""


def collate_labels(labels: Sequence[Any]) -> Any:
    """The labels of a batch as the DataLoader's default collate gives them, where it can.

    Int class ids -> an int64 array; other numbers -> float32; equal-length lists of
    numbers -> a 2-D float32 array; anything else (text, JSON objects, ``None``) -> the list.
    """
    values = list(labels)
    if values and all(isinstance(v, Integral) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.int64)
    if values and all(isinstance(v, Real) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.float32)
    if values and all(
        isinstance(v, list | tuple)
        and len(v) == len(values[0])
        and all(isinstance(x, Real) and not isinstance(x, bool) for x in v)
        for v in values
    ):
        return np.asarray(values, dtype=np.float32)
    return values


class PadCollate:
    """A ``collate_fn`` that pads a batch of images to its largest height and width.

    Called with a list of ``(image, label)`` samples (a dataset's ``ds[i]``), it returns
    ``(images, labels, widths)``, or ``(images, labels, widths, heights)`` with
    ``heights=True``: `images` is one array ``N x H_max x W_max x C`` (``N x C x H_max x
    W_max`` for ``layout="CHW"``) of the images' dtype, each image at the top left and the
    rest `pad_value`; `widths` and `heights` are int64 arrays of each image's own size;
    `labels` as `collate_labels` gives them (an int64 array for class ids, the list for text).

    Args:
        pad_value: the fill of the padding.
        heights: also return the heights (after the widths).
        multiple: round the padded height and width up to a multiple of this (for a model
            that downsamples by a fixed factor).
        layout: ``"HWC"`` (default: what datasets and `readers.transforms.ResizeTo`
            return) or ``"CHW"`` (after a transform that moves channels first).

    Raises:
        ValueError: `multiple` below 1 or an unknown `layout`; on a call, images that are
            not numpy arrays of the layout, or whose channels or dtypes differ.

    Example::

        loader = paddle.io.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=pad_collate)
        for images, labels, widths in loader: ...
    """

    def __init__(
        self,
        pad_value: int | float = 0,
        *,
        heights: bool = False,
        multiple: int = 1,
        layout: str = "HWC",
    ) -> None:
        if not isinstance(multiple, int) or multiple < 1:
            raise ValueError(f"multiple={multiple!r}: expected an int >= 1")
        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r}: expected 'HWC' or 'CHW'")
        self.pad_value = pad_value
        self.heights = bool(heights)
        self.multiple = multiple
        self.layout = layout

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_value={self.pad_value!r}, heights={self.heights}, "
            f"multiple={self.multiple}, layout={self.layout!r})"
        )

    def _hwc(self, image: Any, n: int) -> np.ndarray:
        """`image` as an HxWxC view (a 2-D image gets one channel), or ValueError."""
        if not isinstance(image, np.ndarray) or image.ndim not in (2, 3):
            what = (
                f"of shape {image.shape}"
                if isinstance(image, np.ndarray)
                else f"a {type(image).__name__}"
            )
            raise ValueError(
                f"PadCollate: sample {n} of the batch is {what}, not an HxW or "
                f"{'CxHxW' if self.layout == 'CHW' else 'HxWxC'} numpy image; pad before "
                "transforms that make tensors, or pass layout='CHW'"
            )
        if image.ndim == 2:
            return image[:, :, np.newaxis]
        return image.transpose(1, 2, 0) if self.layout == "CHW" else image

    def __call__(self, batch: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
        """Pad and stack `batch`, a list of ``(image, label)``; see the class docstring."""
        if len(batch) == 0:
            raise ValueError("PadCollate: an empty batch")
        images = [self._hwc(sample[0], n) for n, sample in enumerate(batch)]
        first = images[0]
        for n, image in enumerate(images):
            if image.shape[2] != first.shape[2] or image.dtype != first.dtype:
                raise ValueError(
                    f"PadCollate: sample {n} has {image.shape[2]} channels of {image.dtype}, "
                    f"sample 0 has {first.shape[2]} of {first.dtype}; decode them alike "
                    "(decode='rgb' gives 3 channels to every image)"
                )
        heights = np.asarray([image.shape[0] for image in images], dtype=np.int64)
        widths = np.asarray([image.shape[1] for image in images], dtype=np.int64)
        step = self.multiple
        top = -(-int(heights.max()) // step) * step
        right = -(-int(widths.max()) // step) * step
        out = np.full((len(images), top, right, first.shape[2]), self.pad_value, first.dtype)
        for n, image in enumerate(images):
            out[n, : image.shape[0], : image.shape[1]] = image
        if self.layout == "CHW":
            out = np.ascontiguousarray(out.transpose(0, 3, 1, 2))
        labels = collate_labels([sample[1] for sample in batch])
        if self.heights:
            return out, labels, widths, heights
        return out, labels, widths


pad_collate = PadCollate()
"""`PadCollate` with its defaults: ``(images NxHxWxC padded with 0, labels, widths)``."""
