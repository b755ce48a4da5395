"""Object storage on loopback: ShardStream by byte range vs local disk, and a build from an
``s3://`` SRC of many small objects vs the same local build, each beside the server's ceiling.

    python scripts/bench_s3.py [--images 4000] [--objects 10000] [--repeats 3]
                               [--build-repeats 1] [--s3rver PATH]

Targets: ShardStream from S3 >= 0.7x the local stream's throughput; the s3:// SRC
build within 2x of the local build. The server is moto's standalone server (as in the tests),
or with ``--s3rver node_modules/.bin/s3rver`` the s3rver package from npm (a faster S3 server,
for the benchmark only; s3rver 3.7.1 answers ListObjectsV2 with InternalError past 1,000 keys,
so give it ``--objects 900``). The server shares the machine's cores with the client, so beside each
ratio the same run measures what a minimal client gets from the same server: presigned URLs
(signed before the clock starts) fetched over urllib3 keep-alive pools on threads:

- ``stream.ceiling``: 8 MiB ranged GETs, 4 in flight, of the same shard objects (MB/s), and the
  ratio to the local stream that this rate would give;
- ``build.ceiling``: GETs of the same small objects, 16 in flight (objects/s), and the best
  ratio a download at that rate allows: (local build + objects / rate) / local build.

``s3_via_s3fs`` is the same S3 stream with every ranged GET sent through s3fs and aiobotocore's
request pipeline (``PACKER_S3_DIRECT=0``) instead of a direct GET of a presigned URL over the
same client's HTTP session. A stream pass is timed from a stream opened beforehand (as a
training job opens it once); each pass opens a new one, so that nothing of the previous pass is
kept (``s3_open_s``: the open).
CPU seconds of the server (``/proc``) and the client are given per pass, per object and per MB.
Prints one JSON object with medians of ``--repeats`` passes (``--build-repeats`` builds).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchlib


def eprint(*args: object) -> None:
    """Progress on stderr."""
    print(*args, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(s3rver: str | None, data: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start moto's server (or s3rver) on a free loopback port: (process, URL, its name)."""
    port = _free_port()
    if s3rver:
        cmd = [s3rver, "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s"]
        cmd.append("--allow-mismatched-signatures")
        name = "s3rver (npm) on 127.0.0.1"
    else:
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        name = "moto server on 127.0.0.1"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}", name


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of the finished child processes of this one."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Meter:
    """Wall, client and server CPU seconds of one measured step."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid

    def __call__(self, step: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        """Run `step`; return its result and its seconds."""
        s0, c0, k0 = cpu_seconds(self.pid), time.process_time(), children_cpu()
        t = time.perf_counter()
        out = step()
        wall = time.perf_counter() - t
        client = time.process_time() - c0 + children_cpu() - k0
        return out, {"wall": wall, "client_cpu": client, "server_cpu": cpu_seconds(self.pid) - s0}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median of each measure over `runs`."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def write_images(dst: Path, count: int, *, size: int = 64) -> int:
    """`count` generated PNG/JPEG images in 10 class folders; returns their total bytes."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    total = 0
    for i in range(count):
        folder = dst / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = cv2.resize(base, (size, size), interpolation=cv2.INTER_LINEAR)
        ext = ".png" if i % 2 else ".jpg"
        ok, buf = cv2.imencode(ext, image)
        assert ok
        (folder / f"img_{i:05d}{ext}").write_bytes(buf.tobytes())
        total += len(buf)
    return total


def open_stream(source: str | Path, epoch: int, *, verify_crc: bool = False) -> Any:
    """``ShardStream(source, decode="bytes")`` for `epoch`, opened (index read, objects noted).

    With `verify_crc`, the local dataset checks every record's CRC-32, as one read by range does.
    A new stream per pass: a dataset read by range starts with no bytes kept, as in a
    DataLoader worker (a fresh process each epoch).
    """
    from readers import RecordIODataset, ShardStream

    opened: Any = RecordIODataset(source, decode="bytes", verify_crc=True) if verify_crc else source
    return ShardStream(opened, decode="bytes", seed=epoch)


def stream_pass(source: str | Path, epoch: int) -> int:
    """One full pass of a new stream over `source`; the image bytes read."""
    return sum(len(image) for image, _ in open_stream(source, epoch))


def build_cli(src: str, out: str | Path) -> None:
    """``packer build SRC OUT --format recordio --workers 1 --overwrite``."""
    cmd = [sys.executable, "-m", "packer.cli", "build", src, str(out), "-f", "recordio"]
    done = subprocess.run(
        [*cmd, "--workers", "1", "--overwrite"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"packer build {src} failed:\n{done.stderr[-3000:]}")


class MinimalClient:
    """GETs of presigned URLs over urllib3 keep-alive pools: as little client work as can be."""

    def __init__(self, endpoint: str, threads: int) -> None:
        import boto3
        import urllib3

        self.s3 = boto3.client("s3", endpoint_url=endpoint)
        self.http = urllib3.PoolManager(maxsize=threads)
        self.threads = threads

    def url(self, bucket: str, key: str) -> str:
        """A presigned GET URL of ``bucket/key``."""
        params = {"Bucket": bucket, "Key": key}
        return str(self.s3.generate_presigned_url("get_object", Params=params, ExpiresIn=3600))

    def get(self, url: str, byte_range: tuple[int, int] | None = None) -> int:
        """GET `url` (bytes ``[a, b)`` of it); the bytes received."""
        headers = (
            {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
        )
        resp = self.http.request("GET", url, headers=headers)
        if resp.status not in (200, 206):
            raise RuntimeError(f"GET {url}: HTTP {resp.status}")
        return len(resp.data)

    def get_all(self, jobs: list[tuple[str, tuple[int, int] | None]]) -> int:
        """Run `jobs` on `threads` threads; the bytes received."""
        with ThreadPoolExecutor(self.threads) as pool:
            return sum(pool.map(lambda job: self.get(*job), jobs))


def bench_stream(
    args: argparse.Namespace, tmp: Path, meter: Meter, endpoint: str
) -> dict[str, Any]:
    """ShardStream local vs S3, and 8 MiB ranged GETs of the same objects by a minimal client."""
    from packer.build import build
    from packer.config import BuildConfig
    from readers.datasets.remote import RemoteShards
    from readers.formats.recordio import FORMAT

    eprint(f"writing {args.images} images and building RecordIO ...")
    write_images(tmp / "imgs", args.images)
    local = tmp / "ds.recordio"
    build(BuildConfig(src=tmp / "imgs", out=local, format="recordio"))
    url = "s3://bench/ds.recordio"
    build_cli(str(tmp / "imgs"), url)  # published: data first, meta.json last
    stream_pass(url, 99)  # this process's client made once (as a training process would)
    shards = RemoteShards(url, None, FORMAT)
    nbytes = stream_pass(local, 99)
    minimal = MinimalClient(endpoint, threads=4)
    piece = 8 << 20
    jobs: list[tuple[str, tuple[int, int] | None]] = []
    for obj in shards.objects.objects:
        bucket, key = obj.path.split("/", 1)
        link = minimal.url(bucket, key)
        jobs.extend((link, (a, min(a + piece, obj.size))) for a in range(0, obj.size, piece))
    shard_bytes = sum(o.size for o in shards.objects.objects)
    runs: dict[str, list[dict[str, float]]] = {
        "local": [],
        "local_crc": [],
        "s3": [],
        "s3_via_s3fs": [],
        "ceiling": [],
    }
    opens: list[float] = []
    for epoch in range(args.repeats):
        eprint(
            f"stream pass {epoch + 1}/{args.repeats}: local, local with CRC checks, S3, S3 with "
            "every GET through s3fs, ceiling"
        )
        for name, source, crc in (
            ("local", local, False),
            ("local_crc", local, True),
            ("s3", url, False),
            ("s3_via_s3fs", url, False),
        ):
            # s3_via_s3fs: each range through s3fs/aiobotocore's pipeline, as before direct GETs
            os.environ["PACKER_S3_DIRECT"] = "0" if name == "s3_via_s3fs" else "1"
            stream, opened = meter(lambda s=source, c=crc, e=epoch: open_stream(s, e, verify_crc=c))
            if name == "s3":
                opens.append(opened["wall"])
            got, seconds = meter(lambda st=stream: sum(len(image) for image, _ in st))
            assert got == nbytes, (name, got)
            runs[name].append(seconds)
        os.environ.pop("PACKER_S3_DIRECT")
        got, seconds = meter(lambda: minimal.get_all(jobs))
        assert got == shard_bytes
        runs["ceiling"].append(seconds)
    med = {name: median_of(r) for name, r in runs.items()}
    mbps = {name: nbytes / m["wall"] / 1e6 for name, m in med.items() if name != "ceiling"}
    mbps["ceiling"] = shard_bytes / med["ceiling"]["wall"] / 1e6
    mb = nbytes / 1e6
    return {
        "samples": args.images,
        "image_bytes": nbytes,
        "shard_bytes": shard_bytes,
        "MBps": {k: round(v, 1) for k, v in mbps.items()},
        "ratio": round(mbps["s3"] / mbps["local"], 2),
        "ratio_vs_local_with_crc": round(mbps["s3"] / mbps["local_crc"], 2),
        "ratio_via_s3fs": round(mbps["s3_via_s3fs"] / mbps["local"], 2),
        "ceiling_ratio": round(mbps["ceiling"] / mbps["local"], 2),
        "target": ">= 0.7",
        "s3_client_cpu_ms_per_MB": round(med["s3"]["client_cpu"] / mb * 1e3, 2),
        "s3_via_s3fs_client_cpu_ms_per_MB": round(med["s3_via_s3fs"]["client_cpu"] / mb * 1e3, 2),
        "crc_accelerated": _crc_accelerated(),
        "local_cpu_ms_per_MB": round(med["local"]["client_cpu"] / mb * 1e3, 2),
        "s3_server_cpu_ms_per_MB": round(med["s3"]["server_cpu"] / mb * 1e3, 2),
        "ceiling_server_cpu_ms_per_MB": round(med["ceiling"]["server_cpu"] / mb * 1e3, 2),
        "s3_range_gets_per_pass": _gets_per_pass(url),
        "s3_open_s": round(statistics.median(opens), 3),
        "seconds": {k: {m: round(v, 3) for m, v in d.items()} for k, d in med.items()},
    }


def _crc_accelerated() -> bool:
    """Whether records read by range are checked with zlib-ng's CRC-32 (else zlib's)."""
    from readers.fastzlib import ACCELERATED

    return ACCELERATED


def _gets_per_pass(url: str) -> int:
    """Ranged GETs one stream pass over `url` makes in this process."""
    stream = open_stream(url, 0)
    for _ in stream:
        pass
    return int(stream.dataset._remote.cache.gets)


def upload_many(endpoint: str, root: Path, prefix: str) -> list[str]:
    """Upload every file under `root` to ``bench/<prefix>``, 8 at a time; the keys."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    keys = [f"{prefix}/{p.relative_to(root).as_posix()}" for p in files]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda kp: s3.put_object(Bucket="bench", Key=kp[0], Body=kp[1].read_bytes()),
                zip(keys, files, strict=True),
            )
        )
    return keys


def bench_build(args: argparse.Namespace, tmp: Path, meter: Meter, endpoint: str) -> dict[str, Any]:
    """A build from the local tree vs from s3://, and small GETs by a minimal client."""
    from packer.mirror import mirror_source

    eprint(f"writing and uploading {args.objects} small objects ...")
    write_images(tmp / "many", args.objects, size=32)
    keys = upload_many(endpoint, tmp / "many", "many")
    minimal = MinimalClient(endpoint, threads=16)
    links: list[tuple[str, tuple[int, int] | None]] = [
        (minimal.url("bench", k), None) for k in keys
    ]
    runs: dict[str, list[dict[str, float]]] = {"local": [], "s3": [], "mirror": [], "ceiling": []}
    for r in range(args.build_repeats):
        eprint(f"build {r + 1}/{args.build_repeats}: local, s3:// SRC, its download alone, ceiling")
        for name, step in (
            ("local", lambda: build_cli(str(tmp / "many"), tmp / "many-local.recordio")),
            ("s3", lambda: build_cli("s3://bench/many/", tmp / "many-s3.recordio")),
            ("mirror", lambda: mirror_source("s3://bench/many/", tmp / "mirror")),
            ("ceiling", lambda: minimal.get_all(links)),
        ):
            runs[name].append(meter(step)[1])
    med = {name: median_of(r) for name, r in runs.items()}
    n = args.objects
    ceiling_rate = n / med["ceiling"]["wall"]
    local_s = med["local"]["wall"]
    return {
        "objects": n,
        "local_s": round(local_s, 2),
        "s3_src_s": round(med["s3"]["wall"], 2),
        "ratio": round(med["s3"]["wall"] / local_s, 2),
        "target": "<= 2",
        "download_objects_per_s": round(n / med["mirror"]["wall"]),
        "ceiling_objects_per_s": round(ceiling_rate),
        "ceiling_ratio": round((local_s + n / ceiling_rate) / local_s, 2),
        "download_client_cpu_ms_per_object": round(med["mirror"]["client_cpu"] / n * 1e3, 2),
        "download_server_cpu_ms_per_object": round(med["mirror"]["server_cpu"] / n * 1e3, 2),
        "ceiling_client_cpu_ms_per_object": round(med["ceiling"]["client_cpu"] / n * 1e3, 2),
        "ceiling_server_cpu_ms_per_object": round(med["ceiling"]["server_cpu"] / n * 1e3, 2),
        "seconds": {k: {m: round(v, 3) for m, v in d.items()} for k, d in med.items()},
    }


def main() -> None:
    """Run both comparisons and print the results as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--build-repeats", type=int, default=1)
    parser.add_argument("--s3rver", default=None, help="path of the s3rver executable (npm)")
    parser.add_argument("--skip-build", action="store_true")
    benchlib.add_output_arguments(parser, "bench_s3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp_name:
        tmp = Path(tmp_name)
        proc, endpoint, name = start_server(args.s3rver, tmp / "server-data")
        key = "S3RVER" if args.s3rver else "testing"
        os.environ.update(
            AWS_ACCESS_KEY_ID=key,
            AWS_SECRET_ACCESS_KEY=key,
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=endpoint,
            PACKER_WORK_DIR=str(tmp / "work"),
        )
        result: dict[str, Any] = {"endpoint": name, "repeats": args.repeats}
        result["load_before"] = [round(x, 2) for x in os.getloadavg()]
        try:
            import boto3

            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
            meter = Meter(proc.pid)
            result["stream"] = bench_stream(args, tmp, meter, endpoint)
            eprint(json.dumps(result["stream"]))
            if not args.skip_build:
                result["build"] = bench_build(args, tmp, meter, endpoint)
        finally:
            proc.terminate()
            proc.wait(10)
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    benchlib.save_results(args, "bench_s3", s3_table(result))


def s3_table(result: dict[str, Any]) -> str:
    """The stream and build comparisons as a markdown table (medians)."""
    rows = [
        "| case | ours | local | ratio | a minimal client's ceiling |",
        "|---|---:|---:|---:|---:|",
    ]
    stream = result.get("stream")
    if stream:
        mbps = stream["MBps"]
        rows.append(
            f"| `ShardStream` pass, {stream['shard_bytes'] / 1e6:.1f} MB of RecordIO "
            f"| {mbps['s3']} MB/s | {mbps['local']} MB/s ({mbps['local_crc']} with CRC checks) "
            f"| {stream['ratio']}x ({stream['ratio_vs_local_with_crc']}x vs CRC-checked) "
            f"| {stream['ceiling_ratio']}x local |"
        )
    build = result.get("build")
    if build:
        rows.append(
            f"| build with an `s3://` SRC of {build['objects']} objects "
            f"| {build['s3_src_s']} s | {build['local_s']} s | {build['ratio']}x "
            f"| {build['ceiling_ratio']}x local |"
        )
    return f"Server: {result['endpoint']}, {result['repeats']} repeats.\n\n" + "\n".join(rows)


if __name__ == "__main__":
    main()
