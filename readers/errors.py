"""Errors raised by the read side; each names the file, shard, key or sample it is about."""

from __future__ import annotations


class ReaderError(Exception):
    """A packed dataset cannot be read as asked."""


class DatasetFormatError(ReaderError):
    """A path is not a dataset we can open, or its files disagree with each other."""


class RecordError(ReaderError):
    """One record could not be read or decoded."""


class DatasetRebuiltError(ReaderError):
    """A shard is not of the build a reader opened: the dataset was rebuilt (or appended to).

    Never skipped by ``on_error="skip"``: every later read would be of the new build. It takes
    one message argument, so that paddle can re-raise it from a DataLoader worker.
    """

    @classmethod
    def of(cls, root: str, what: str) -> DatasetRebuiltError:
        """The error for the dataset at `root`, saying `what` changed."""
        return cls(
            f"{root} was rebuilt after this dataset was opened ({what}); its index no longer "
            "matches the shards, so reading on would return other images; reopen it"
        )
