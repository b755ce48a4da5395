"""Where staging copies a dataset from: a local directory, or a dataset in object storage.

Both answer the same questions by the dataset-relative name of a file: its bytes, whether it
is there, its size, a stamp that changes when the file does, and a binary file to copy.  A
local origin reaches each file through no symbolic link (`readers.files.open_inside`) and
lets a shard that does not fit in the cache be read in place; a remote one cannot.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from readers.files import open_inside, stat_inside
from readers.formats.layout import META_NAME
from readers.staging.files import StagingError


class LocalOrigin:
    """A packed dataset directory on this machine (or a shared filesystem mounted here)."""

    remote = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path).resolve()
        self.key = str(self.root)
        self.name = self.root.name

    def where(self, rel: str) -> str:
        """The path of the file `rel`, for messages."""
        return str(self.root / rel)

    def read_meta(self) -> bytes:
        """The bytes of meta.json (a regular file, not a link)."""
        try:
            with open_inside(self.root, META_NAME) as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise StagingError(
                f"{self.root}: no {META_NAME}; only a packed dataset (packer build) can be staged"
            ) from None

    def size(self, rel: str) -> int:
        """The size of the regular file `rel`; FileNotFoundError when it is missing."""
        return stat_inside(self.root, rel).st_size

    def stamp(self, rel: str) -> list[Any]:
        """Size and mtime of `rel`: another value means the file changed."""
        st = stat_inside(self.root, rel)
        return [st.st_size, st.st_mtime_ns]

    @contextlib.contextmanager
    def open(self, rel: str) -> Iterator[tuple[IO[bytes], int]]:
        """Yield ``(binary file, permission bits)`` of `rel`, reached through no link."""
        with open_inside(self.root, rel) as f:
            with contextlib.suppress(OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            yield f, os.fstat(f.fileno()).st_mode & 0o666

    def downloads(self, rel: str) -> bool:
        """False: a local file is copied by reading it (`open`)."""
        return False

    def download(self, rel: str, out: IO[bytes], progress: Any = None) -> dict[str, int]:
        """Not for a local origin (see `downloads`)."""
        raise NotImplementedError(rel)

    def dir_mode(self, entry: str = "") -> int:
        """Permissions of a directory made for the origin directory `entry`.

        At most the origin's (and the umask's), always usable by its owner.
        """
        return (os.stat(self.root / entry, follow_symlinks=False).st_mode & 0o777) | 0o700

    def link_target(self, entry: str) -> str | None:
        """What a staged dataset links for a shard entry not (yet) copied: the origin's."""
        return str(self.root / entry)


class RemoteOrigin:
    """A dataset published in object storage (`readers.remote.dataset.RemoteDataset`).

    Staged copies are made readable by their owner only: the bucket's permissions cannot be
    carried into a shared cache directory.
    """

    remote = True

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        from readers.remote.dataset import RemoteDataset

        self.dataset = RemoteDataset(url, storage_options)
        self.key = self.dataset.url
        self.name = self.dataset.name

    def where(self, rel: str) -> str:
        """The URL of the object `rel`, for messages."""
        return self.dataset.where(rel)

    def read_meta(self) -> bytes:
        """The bytes of meta.json, read when the origin was made."""
        return self.dataset.meta_bytes

    def size(self, rel: str) -> int:
        """The size of the object `rel`; FileNotFoundError when it is missing."""
        return int(self.dataset.stat(rel)["size"])

    def stamp(self, rel: str) -> list[Any]:
        """Size and ETag of the object `rel`: another value means it changed."""
        try:
            st = self.dataset.stat(rel)
        except FileNotFoundError:
            raise self.gone(rel) from None
        return [st["size"], st["etag"]]

    @contextlib.contextmanager
    def open(self, rel: str) -> Iterator[tuple[IO[bytes], int]]:
        """Yield ``(binary file, permission bits)`` of the object `rel`.

        Raises:
            StagingError: the object is gone since meta.json was read (a replaced dataset).
        """
        try:
            f = self.dataset.open(rel)
        except FileNotFoundError:
            raise self.gone(rel) from None
        with f:
            try:
                yield f, 0o600
            except PermissionError as exc:
                from readers.io.ranges import credentials_error

                raise credentials_error(self.where(rel), exc) from exc
            except Exception as exc:
                if "checksum" not in str(exc).lower():
                    raise
                raise StagingError(
                    f"{self.where(rel)}: the bytes received do not match the object's checksum "
                    f"({exc}); stage again (a transfer error), and if it persists re-upload "
                    "the object"
                ) from exc

    def downloads(self, rel: str) -> bool:
        """Whether `rel` is copied by `download` (S3: ranged GETs in flight), not by `open`."""
        from readers.staging.download import supports

        return supports(self.dataset.fs)

    def download(self, rel: str, out: IO[bytes], progress: Any = None) -> dict[str, int]:
        """Write the object `rel` to `out` (`readers.staging.download.download`), checked.

        Returns ``{"size": ..., "crc32": ...}`` of the bytes written.

        Raises:
            StagingError: the bytes do not match the object's checksum, or could not be read.
            RemoteCredentialsError: the store refused the requests.
        """
        from readers.staging.download import download

        path = self.dataset.object_path(rel)
        return download(self.dataset.fs, path, self.where(rel), out, progress)

    def gone(self, rel: str) -> StagingError:
        """The error for an object that meta.json names but that is no longer there."""
        return StagingError(
            f"{self.where(rel)}: gone since {META_NAME} was read; the dataset was replaced "
            "(packer build --overwrite) or is being deleted. Open it again to stage the new "
            "version"
        )

    def dir_mode(self, entry: str = "") -> int:
        """Owner-only directories (see the class docstring)."""
        return 0o700

    def link_target(self, entry: str) -> str | None:
        """None: a shard not copied cannot be read in place from object storage."""
        return None


Origin = LocalOrigin | RemoteOrigin


def make_origin(path: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Origin:
    """The origin of `path`: remote for a URL (``s3://...``), else a local directory."""
    from readers.remote import is_url

    if is_url(path):
        return RemoteOrigin(str(path), storage_options)
    return LocalOrigin(path)
