"""Object storage on loopback (moto's S3 server): ShardStream by byte range vs local disk, and a
build from an ``s3://`` SRC of many small objects vs the same local build.

    python scripts/bench_s3.py [--images 4000] [--objects 10000] [--repeats 3]

Targets (issue 20): ShardStream from S3 >= 0.7x the local stream's throughput; the s3:// SRC
build within 2x of the local build. Prints one JSON object with medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def eprint(*args: object) -> None:
    """Progress on stderr."""
    print(*args, file=sys.stderr, flush=True)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m moto.server`` on a free loopback port; return it and its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


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


def stream_seconds(source: str, repeats: int) -> tuple[list[float], int]:
    """Wall seconds of full passes of ``ShardStream(source, decode="bytes")``, and bytes read."""
    from readers import ShardStream

    times, nbytes = [], 0
    for epoch in range(repeats):
        stream = ShardStream(source, decode="bytes", seed=epoch)
        t = time.perf_counter()
        nbytes = sum(len(image) for image, _ in stream)
        times.append(time.perf_counter() - t)
    return times, nbytes


def build_seconds(src: str, out: str | Path) -> float:
    """Wall seconds of ``packer build SRC OUT --format recordio`` (one worker)."""
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "packer.cli",
            "build",
            src,
            str(out),
            "-f",
            "recordio",
            "--workers",
            "1",
            "--overwrite",
        ],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def main() -> None:
    """Run both comparisons and print the results as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    proc, endpoint = start_moto()
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    import s3fs

    from packer.build import build
    from packer.config import BuildConfig

    result: dict[str, Any] = {"endpoint": "moto server on 127.0.0.1", "repeats": args.repeats}
    try:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
        fs.mkdir("bench")
        with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp_name:
            tmp = Path(tmp_name)
            eprint(f"writing {args.images} images and building RecordIO ...")
            result["images_bytes"] = write_images(tmp / "imgs", args.images)
            local = tmp / "ds.recordio"
            build(BuildConfig(src=tmp / "imgs", out=local, format="recordio"))
            url = "s3://bench/ds.recordio"
            build_seconds(str(tmp / "imgs"), url)  # published: data first, meta.json last
            eprint("ShardStream: local disk (page cache) ...")
            local_t, nbytes = stream_seconds(str(local), args.repeats)
            eprint("ShardStream: S3 by byte range ...")
            s3_t, s3_bytes = stream_seconds(url, args.repeats)
            assert s3_bytes == nbytes
            local_mbs = nbytes / statistics.median(local_t) / 1e6
            s3_mbs = nbytes / statistics.median(s3_t) / 1e6
            result["stream"] = {
                "samples": args.images,
                "bytes": nbytes,
                "local_s": [round(t, 3) for t in local_t],
                "s3_s": [round(t, 3) for t in s3_t],
                "local_MBps": round(local_mbs, 1),
                "s3_MBps": round(s3_mbs, 1),
                "ratio": round(s3_mbs / local_mbs, 2),
                "target": ">= 0.7",
            }
            eprint(json.dumps(result["stream"]))
            eprint(f"writing {args.objects} small objects ...")
            write_images(tmp / "many", args.objects, size=32)
            fs.put(str(tmp / "many") + "/", "bench/many/", recursive=True)
            eprint("build from the local tree ...")
            local_build = build_seconds(str(tmp / "many"), tmp / "many-local.recordio")
            eprint("build from s3:// SRC ...")
            s3_build = build_seconds("s3://bench/many/", tmp / "many-s3.recordio")
            result["build"] = {
                "objects": args.objects,
                "local_s": round(local_build, 2),
                "s3_src_s": round(s3_build, 2),
                "ratio": round(s3_build / local_build, 2),
                "target": "<= 2",
            }
    finally:
        proc.terminate()
        proc.wait(10)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
