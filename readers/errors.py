"""Errors raised by the read side; each names the file, shard, key or sample it is about."""

from __future__ import annotations


class ReaderError(Exception):
    """A packed dataset cannot be read as asked."""


class DatasetFormatError(ReaderError):
    """A path is not a dataset we can open, or its files disagree with each other."""


class RecordError(ReaderError):
    """One record could not be read or decoded."""
