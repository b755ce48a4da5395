"""Why a path given as a dataset is not one, when the reason is a common mistake.

Two mistakes get their own message wherever a dataset path is opened (`open_dataset`, the
datasets, ``packer info`` and ``packer verify``): a path that does not exist, and a folder of
images that was never packed.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from readers.formats.images import IMAGE_EXTENSIONS

SCAN_LIMIT = 10_000
"""Files looked at, at most, to tell a folder of images (it is an error path, kept quick)."""


def count_images(root: Path, limit: int = SCAN_LIMIT) -> tuple[int, int, bool]:
    """Image files and all files under `root`, looking at `limit` files at most.

    Returns:
        (images, files, complete): ``complete`` is False when the limit stopped the count.
    """
    images = files = 0
    for parent, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith("."):
                continue
            files += 1
            images += os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
            if files >= limit:
                return images, files, False
        del parent
    return images, files, True


def explain_not_dataset(root: str | os.PathLike[str]) -> str | None:
    """The message for `root` when it does not exist or is a folder of images, else None.

    Call it once `root` has been found to be no dataset: it does not look for one.
    """
    path = Path(root)
    if not path.exists():
        return f"{path}: does not exist" + (" (a broken link)" if path.is_symlink() else "")
    if not path.is_dir():
        return None
    images, files, complete = count_images(path)
    if images == 0 or images * 2 < files:
        return None
    found = f"{images}" if complete else f"{images}+"
    packed = path.with_name(path.name + ".lmdb") if path.name else Path("out.lmdb")
    return (
        f"{path} looks like a folder of images ({found} found), not a packed dataset: pack it "
        f"first with `packer build {shlex.quote(str(path))} {shlex.quote(str(packed))}`"
    )
