"""The Ray engine: each planned shard is one Ray task, run on any node of a cluster.

A task runs the shard task (`packer.task.run_shard`: read, check and transform the shard's
images in one process and write the shard) straight into the build directory, which must be on a
filesystem that every node mounts at the same path (as must SRC).  It writes the shard with
the provisional first id ``shard.start``; the driver's merge renumbers where earlier shards
skipped inputs, so the dataset equals a local build's byte for byte.

Faults: a task whose process dies (killed, out of memory, its node lost) is retried by Ray up
to `MAX_RETRIES` times, and each attempt starts the shard from scratch; a bad input follows
``--on-error`` (``fail``: the build stops with the first bad input in entry order, as a local
build does); a task that died on every retry stops the build with `EngineError`, keeping the
finished shards for ``--resume``.  Progress advances per finished shard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packer.config import BuildConfig
from packer.engines import EngineError, progress_bar
from packer.errors import ConfigError, PackerError
from packer.job import BuildJob, ShardSettings
from packer.plan import ShardPlan
from packer.records import Entry
from packer.scan import SourceFile
from packer.task import make_portable, rebuild, run_shard
from readers.formats.layout import shard_name

MAX_RETRIES = 3
"""Times Ray runs a shard's task again after its process died."""

_IN_FLIGHT = 2  # tasks submitted per cluster CPU: keeps every CPU busy, the driver's memory bounded
_CANCEL_WAIT_S = 30.0


@dataclass(frozen=True)
class ShardJob:
    """What one task needs besides the `ShardSettings`.

    That is the shard and its entries (with absolute paths).
    """

    tmp: str
    src: str
    shard: ShardPlan
    entries: list[Entry]


@dataclass
class _NodeStats:
    shards: int = 0
    images: int = 0
    seconds: float = 0.0  # summed over the node's tasks


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--engine ray needs Ray on every node: pip install ray (from a packer clone: "
            "pip install '.[ray]')"
        ) from None
    return ray


def _shard_task(settings: ShardSettings, job: ShardJob) -> dict[str, Any]:
    """Write one shard (in a Ray worker); return its counts and where it ran, or its error."""
    started = time.perf_counter()
    host, ip = socket.gethostname(), str(_import_ray().util.get_node_ip_address())
    try:
        for what, path in (("SRC", job.src), ("the build directory", job.tmp)):
            if not os.path.isdir(path):
                raise EngineError(
                    f"node {host} ({ip}) does not see {what} {path}: SRC and OUT's parent "
                    "must be on a filesystem that every node mounts at the same path"
                )
        done = run_shard(settings, Path(job.tmp), job.shard, job.entries)
    except PackerError as exc:
        return {"error": make_portable(exc)}
    return {
        "count": int(done["count"]),
        "bytes": int(done["bytes"]),
        "images": len(job.entries),
        "host": host,
        "ip": ip,
        "seconds": time.perf_counter() - started,
    }


def _check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` that nothing listens on (Ray itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if sep and port.isdigit():  # not "auto" or another form that Ray resolves itself
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()


def _connect(ray: Any, cfg: BuildConfig, say: Callable[[str], None]) -> None:
    """Connect to ``--ray-address`` (or ``RAY_ADDRESS``), else start a local instance."""
    quiet: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,  # task failures come back as results and exceptions
        "logging_level": logging.ERROR,
    }
    address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        ray.init(address="local", num_cpus=cfg.workers, **quiet)
        say(f"ray: started a local instance with {cfg.workers} CPUs")
        return
    try:
        _check_reachable(address)
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
        raise ConfigError(
            f"--ray-address {address}: cannot connect to a Ray cluster there ({exc}); start "
            "one with `ray start --head` and give its address (host:6379, or ray://host:10001)"
        ) from None
    say(f"ray: connected to {address}")


def run_ray(job: BuildJob, *, say: Callable[[str], None]) -> None:
    """Write the unfinished planned shards of `job`, one Ray task each.

    Uses the Ray connection of this process when there is one; otherwise connects as
    `_connect` says and disconnects (stopping a local instance it started) at the end.

    Raises:
        InputError: a bad input with ``on_error="fail"`` (the first in entry order).
        EngineError: a task died on every retry, or a node does not see the shared files.
        ConfigError: Ray is not installed, or ``--ray-address`` cannot be reached.
    """
    ray = _import_ray()
    connected_here = not ray.is_initialized()
    if connected_here:
        _connect(ray, job.cfg, say)
    try:
        _run(ray, job, say)
    finally:
        if connected_here:
            ray.shutdown()


def _shard_jobs(job: BuildJob, todo: list[ShardPlan]) -> Iterator[ShardJob]:
    """The task of each shard of `todo`, made when it is submitted."""
    # Workers do not run in the driver's directory: every path they get is absolute.
    src = os.path.abspath(job.cfg.src)
    root = os.path.abspath(job.tmp)
    for shard in todo:
        shard_entries = [
            replace(e, file=SourceFile(e.file.rel, os.path.abspath(e.file.path)))
            for e in job.entries_of(shard)
        ]
        yield ShardJob(root, src, shard, shard_entries)


def _run(ray: Any, build_job: BuildJob, say: Callable[[str], None]) -> None:
    started = time.perf_counter()
    todo = build_job.todo
    task = ray.remote(_shard_task).options(max_retries=MAX_RETRIES, num_cpus=1)
    settings_ref = ray.put(build_job.settings)
    limit = max(2, _IN_FLIGHT * int(ray.cluster_resources().get("CPU", 1)))
    jobs = _shard_jobs(build_job, todo)  # made as they are submitted: memory stays bounded
    job: ShardJob | None = next(jobs, None)
    pending: dict[Any, ShardJob] = {}
    failed: tuple[int, BaseException] | None = None
    nodes: dict[tuple[str, str], _NodeStats] = {}
    written = 0
    with progress_bar(len(build_job.entries), build_job.cfg.progress) as bar:
        bar.update(len(build_job.entries) - sum(s.stop - s.start for s in todo))
        try:
            while job is not None or pending:
                while job is not None and failed is None and len(pending) < limit:
                    pending[task.remote(settings_ref, job)] = job
                    job = next(jobs, None)
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    ran = pending.pop(ref)
                    outcome = _outcome(ray, ref, ran)
                    if isinstance(outcome, BaseException):
                        # Like a local build, report the first failing shard in plan order:
                        # stop the later shards, let the earlier ones finish.
                        if failed is None or ran.shard.number < failed[0]:
                            failed = (ran.shard.number, outcome)
                        later = [r for r, j in pending.items() if j.shard.number > failed[0]]
                        _cancel(ray, later)
                        for r in later:
                            del pending[r]
                        continue
                    written += outcome["bytes"]
                    node = nodes.setdefault((outcome["host"], outcome["ip"]), _NodeStats())
                    node.shards += 1
                    node.images += outcome["images"]
                    node.seconds += outcome["seconds"]
                    bar.update(outcome["images"])
                    rate = written / max(time.perf_counter() - started, 1e-9) / 1e6
                    shards_done = sum(n.shards for n in nodes.values())
                    bar.set_postfix_str(f"{shards_done}/{len(todo)} shards, {rate:.1f} MB/s")
            if failed is not None:
                raise failed[1]
        except BaseException:
            _cancel(ray, list(pending))
            raise
    if nodes:
        say(
            f"ray: {len(todo)} shard(s) on {len(nodes)} node(s) in "
            f"{time.perf_counter() - started:.1f} s"
        )
        for (host, ip), node in sorted(nodes.items()):
            say(
                f"  {host} ({ip}): {node.shards} shards, {node.images} images, "
                f"{node.seconds:.1f} s in tasks"
            )


def _outcome(ray: Any, ref: Any, job: ShardJob) -> dict[str, Any] | BaseException:
    """A finished task's result, or the exception that the build should stop with."""
    name = shard_name(job.shard.number)
    try:
        result: dict[str, Any] = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause: BaseException | None = exc.cause
        if isinstance(cause, OSError):  # a full disk and such: handled as in a local build
            return cause
        bug: BaseException = exc  # our bug: it keeps the task's traceback
        return bug
    except ray.exceptions.RayError as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return EngineError(
            f"{name}: its Ray task did not finish, retried up to {MAX_RETRIES} times "
            f"({type(exc).__name__}: {detail}); the finished shards are kept: run the same "
            "command with --resume"
        )
    if "error" in result:
        return rebuild(result["error"])
    return result


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Stop the tasks of `refs` and wait for them, so none writes after the build gave up."""
    if not refs:
        return
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=_CANCEL_WAIT_S)
