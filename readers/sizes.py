"""Sizes written by people (``1GiB``, ``500MB``, ``1.5k``, ``4096``) as byte counts, parsed once.

Units are case-insensitive: ``k``/``m``/``g``/``t`` are powers of 1000 and ``ki``/``mi``/``gi``/
``ti`` powers of 1024, each with or without a trailing ``b``; a bare number (or ``b``) is bytes.
`packer build --shard-size` and the staging cache limit both parse with `parse_size` and turn
its `SizeError` into their own error.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40})


class SizeError(ValueError):
    """A text that is not a size."""

    def __init__(self, text: str) -> None:
        super().__init__(
            f"{text!r} is not a size; expected a number with an optional unit such as "
            "1GiB, 512MiB, 500MB or 4096"
        )
        self.text = text


def parse_size(text: str) -> int:
    """The number of bytes `text` names: ``"1GiB"`` -> 1073741824, ``"500MB"`` -> 500000000.

    Raises:
        SizeError: `text` is not a number with an optional unit.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise SizeError(text)
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
