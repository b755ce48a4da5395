"""That the parts of a ``packer split`` beside a part are of the same split.

Each part's meta.json records its split (``options.split``: the source's index digest, the
fractions naming every part, the seed, stratify). A part's siblings are the other names of
its fractions, in the same directory; one that is there but records another split (a split
interrupted while its parts were put in place, or a part replaced on its own) would overlap
this part or miss samples, so `sibling_problems` names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from readers.formats.layout import META_NAME

SPLIT_IDENTITY = ("index_sha256", "fractions", "seed", "stratify")
"""The fields of ``options.split`` that two parts of one split share."""


def _split_of(meta: Any) -> dict[str, Any] | None:
    options = meta.get("options") if isinstance(meta, dict) else None
    split = options.get("split") if isinstance(options, dict) else None
    return split if isinstance(split, dict) else None


def sibling_problems(root: Path, meta: dict[str, Any]) -> list[str]:
    """Why the parts beside the split part `root` are not of its split (empty when they are).

    A sibling that is missing is not a problem (parts may be moved apart); one that is there
    and records no split, or another one, is.
    """
    split = _split_of(meta)
    fractions = split.get("fractions") if split is not None else None
    if split is None or not isinstance(fractions, dict):
        return []
    ours = {k: split.get(k) for k in SPLIT_IDENTITY}
    found = []
    for name in fractions:
        if name == split.get("part"):
            continue
        sibling = root.parent / str(name)
        try:
            with open(sibling / META_NAME, encoding="utf-8") as f:
                theirs_split = _split_of(json.load(f))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            found.append(f"split part {name!r} beside it: {sibling / META_NAME} unreadable ({exc})")
            continue
        theirs = None if theirs_split is None else {k: theirs_split.get(k) for k in SPLIT_IDENTITY}
        if theirs != ours:
            differ = (
                "records no split"
                if theirs is None
                else "is of another split ("
                + ", ".join(
                    f"{k} {theirs[k]!r}, here {ours[k]!r}"
                    for k in SPLIT_IDENTITY
                    if theirs[k] != ours[k]
                )
                + ")"
            )
            found.append(
                f"split part {name!r} beside it, {sibling}, {differ}: the parts may overlap "
                "or miss samples; run the packer split again (with --overwrite)"
            )
    return found
