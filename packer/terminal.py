r"""Text from data (labels, class names, paths) made safe to print on a terminal: `shown`.

Control characters (C0, DEL, C1: the ESC of colour and cursor sequences, ``\r`` that
overwrites a line), line and paragraph separators, lone surrogates and the bidirectional
controls that reorder a line are written as Python's ``repr`` writes them (``\x1b``, ``\r``,
``\u202e``); every other character, any script included, is shown as it is.
"""

from __future__ import annotations

import unicodedata

# Trojan-source controls: they reorder how the rest of a line is shown
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def unsafe_char(ch: str) -> bool:
    """Whether `ch` is a control character, a line break, a surrogate or a bidi control."""
    return unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ch in _BIDI


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shown(text: object) -> str:
    """``str(text)`` with every `unsafe_char` written as its ``repr`` escape."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(_escape(ch) if unsafe_char(ch) else ch for ch in text)
