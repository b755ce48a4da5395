"""Build settings as a frozen, validated dataclass, and the parsing of sizes like ``1GiB``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from packer.errors import ConfigError
from packer.transform import Transform
from readers import sizes
from readers.formats import FORMATS  # the registered names, the default first

ON_ERROR = ("skip", "fail")
ENGINES = ("local", "ray")  # what writes the shards: `packer.engines`
LABEL_KEYWORDS = ("auto", "dirname", "none", "sidecar")  # the --labels that are not files


def parse_size(text: str) -> int:
    """``1GiB`` -> 1073741824, ``500MB`` -> 500000000, ``4096`` -> 4096 (`readers.sizes`).

    Raises:
        ConfigError: the text is not a size.
    """
    try:
        return sizes.parse_size(text)
    except sizes.SizeError as exc:
        raise ConfigError(str(exc)) from None


def usable_cores() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cap_workers(workers: int) -> int:
    """The processes a build starts for `workers` asked: at most the usable cores.

    Its processes decode images: more of them than cores only compete for those, and each
    costs memory (and its slots in the pool's byte ring), so ``--workers 1000000`` is capped
    rather than forking a million processes.

    Raises:
        ConfigError: `workers` is below 1.
    """
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be at least 1")
    return min(workers, usable_cores())


@dataclass(frozen=True)
class BuildConfig:
    """Everything ``packer build`` was asked to do.

    `src` and `out` may be given as `str` or any `os.PathLike`: they are kept as `Path`.
    """

    src: Path
    out: Path
    format: str = FORMATS[0]
    labels: str | tuple[str, ...] = "auto"  # one source, or several label files (merged)
    label_depth: int = 1  # folder levels that name the class (dirname)
    class_map: str | None = None  # auto | FILE: text labels -> class ids
    shard_size: int = 1 << 30
    workers: int = 1  # capped at the usable cores (`cap_workers`); meta.json records the used
    decode_check: bool = True
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False  # keep the finished shards of an interrupted build of the same plan
    progress: bool | None = None  # None: show a bar when stderr is a terminal
    transform: Transform = field(default_factory=Transform)
    engine: str = "local"  # local | ray: what writes the shards (the output is the same)
    ray_address: str | None = None  # --engine ray: the cluster (None: RAY_ADDRESS, or local)
    dedup: bool = False  # skip sources whose bytes equal an earlier one's (packer.dedup)

    def __post_init__(self) -> None:
        for name in ("src", "out"):  # a str or os.PathLike given by hand
            value: object = getattr(self, name)
            if not isinstance(value, Path):
                if not isinstance(value, (str, os.PathLike)):
                    raise ConfigError(f"{name.upper()} {value!r}: expected a path (str or Path)")
                object.__setattr__(self, name, Path(value))
        specs = (self.labels,) if isinstance(self.labels, str) else tuple(self.labels)
        if not specs:
            raise ConfigError("--labels: no label source given")
        # one spec is kept as a plain string, so meta.json records it as before
        object.__setattr__(self, "labels", specs[0] if len(specs) == 1 else specs)
        keywords = [s for s in specs if s in LABEL_KEYWORDS]
        if keywords and len(specs) > 1:
            raise ConfigError(
                f"--labels {keywords[0]} cannot be combined with other --labels; several "
                "--labels are for label files (list files and manifests), merged"
            )
        if self.label_depth < 1:
            raise ConfigError(f"--label-depth {self.label_depth}: must be at least 1")
        if self.label_depth != 1 and specs[0] not in ("auto", "dirname"):
            raise ConfigError(
                f"--label-depth {self.label_depth} applies to class folders (--labels dirname), "
                f"not to --labels {specs[0]}"
            )
        if self.class_map is not None and specs == ("none",):
            raise ConfigError(f"--class-map {self.class_map}: --labels none has no labels to map")
        if self.format not in FORMATS:
            raise ConfigError(f"--format {self.format!r}: expected one of {', '.join(FORMATS)}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"--on-error {self.on_error!r}: expected skip or fail")
        if self.shard_size < 1:
            raise ConfigError(f"--shard-size {self.shard_size}: must be positive")
        object.__setattr__(self, "workers", cap_workers(self.workers))
        if not self.src.exists():
            raise ConfigError(f"SRC {self.src} does not exist")
        if not self.src.is_dir():
            raise ConfigError(f"SRC {self.src}: a file, not a directory of images")
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        if self.ray_address is not None and self.engine != "ray":
            raise ConfigError(
                f"--ray-address {self.ray_address}: only --engine ray uses a cluster address"
            )

    @property
    def label_specs(self) -> tuple[str, ...]:
        """``labels`` as a tuple: one keyword, or the label files to merge."""
        return (self.labels,) if isinstance(self.labels, str) else self.labels

    def options(self) -> dict[str, object]:
        """The options recorded in meta.json."""
        return {
            "format": self.format,
            "labels": self.labels if isinstance(self.labels, str) else list(self.labels),
            "label_depth": self.label_depth,
            "class_map": self.class_map,
            "shard_size": self.shard_size,
            "workers": self.workers,
            "decode_check": self.decode_check,
            "on_error": self.on_error,
            **self.transform.options(),
            # the cluster's address is where it ran, not how: not recorded
            "engine": self.engine,
            # recorded only when on, so that the plans of earlier builds stay as they were
            **({"dedup": True} if self.dedup else {}),
        }
