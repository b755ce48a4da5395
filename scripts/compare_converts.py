"""Convert the same inputs with another revision of packer and with this tree, and compare the
outputs byte for byte: making ``packer convert`` faster must not change a single byte on disk.

The inputs are written once, deterministically, by this tree: packer datasets of both formats
built from ``make_demo_data.py``'s tree plus files with awkward names (class ids, text labels
with quotes and non-ASCII letters, lists of numbers, no labels, several shards), raw grey
images whose pixels hold the RecordIO magic word at every alignment (multi-part records),
compressed raw pixels, a dataset with one damaged record (a CRC-32 mismatch), and bare inputs
written from their specifications (a scene-text LMDB, an MXNet ``.rec``/``.idx`` pair with
InsightFace's header record: the writers of ``tests/packer/test_convert.py``; WebDataset tars
when the ``webdataset`` package is installed).
Each input is converted to every format with ``python -m packer.cli convert`` in a subprocess
with ``PYTHONPATH`` set to the tree under test (the revision is checked out with ``git worktree
add`` into a temporary directory and removed afterwards), with a small ``--shard-size`` so that
outputs have several shards.

Every file of the two outputs must be equal byte for byte, except ``meta.json`` (compared as
parsed JSON without ``created`` and ``tool_version``) and LMDB's ``lock.mdb``, as in
``compare_builds.py``. Exit status 0 and "identical" when every output matches; else the
differing files and 1.

    python scripts/compare_converts.py [--rev 00b62f0] [--keep DIR] [--only CASE]

Against the default revision one difference is expected and is a fix: ``00b62f0`` dropped the
index's ``compression`` field when it converted compressed raw pixels (its output did not
decode), so the ``ours-raw-lz4-to-*`` cases differ in ``index.jsonl``, ``index.parquet`` and
``meta.json``; every other case must print identical (``--only`` runs the others alone).
Since revision ``99c13ba`` (``compare_builds.WH_KEYS_REV``) LMDB shards hold a ``wh-%09d`` key
per record, so against older revisions every ``*-to-lmdb`` case differs by those keys too
(``data.mdb``, index offsets, shard sizes); ``--rev 99c13ba`` or later compares them byte for
byte.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from compare_builds import checked_out, compare_outputs, run_comparison, run_packer

from tests.packer.test_convert import write_mxnet_rec, write_scene_text_lmdb

DEFAULT_REV = "00b62f0"
"""The last revision before convert's bulk path."""
MAGIC = struct.pack("<I", 0xCED7230A)
TARGETS = ("lmdb", "recordio")
SHARD_SIZE = "30KB"
DEMO_OPTIONS = ("--per-class", "6", "--size", "40", "--seed", "7")


def _write(path: Path, image: np.ndarray, ext: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(ext, image)
    assert ok
    path.write_bytes(buf.tobytes())


def make_tree(src: Path) -> list[str]:
    """The demo tree plus awkward names; return its image paths (relative, sorted)."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_demo_data.py"), str(src), *DEMO_OPTIONS],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    rng = np.random.default_rng(3)
    for name in ('star/ü ñ "quoted".png', "star/back\\slash.jpg", "dots/日本.png"):
        _write(src / name, rng.integers(0, 256, (9, 11, 3), dtype=np.uint8), Path(name).suffix)
    return sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())


def make_magic_tree(src: Path) -> None:
    """Grey images whose raw pixels repeat the RecordIO magic word, at each of 4 phases."""
    for phase in range(4):
        flat = np.frombuffer(MAGIC * 40, dtype=np.uint8)[phase : phase + 12 * 12]
        _write(src / "magic" / f"m{phase}.png", flat.reshape(12, 12).copy(), ".png")
    rng = np.random.default_rng(5)
    _write(src / "noise" / "n0.png", rng.integers(0, 256, (12, 12), dtype=np.uint8), ".png")


def write_tars(root: Path, images: list[bytes]) -> bool:
    """WebDataset tars (cls, txt and json labels); False without the webdataset package."""
    try:
        import webdataset
    except ImportError:
        return False
    root.mkdir()
    labels: list[object] = [0, 1, "some text", {"box": [1, 2]}, 2, "ü"]
    for n in range(2):
        with webdataset.TarWriter(str(root / f"part-{n}.tar")) as sink:
            for i in range(3 * n, 3 * n + 3):
                label = labels[i % len(labels)]
                kind = (
                    "cls" if isinstance(label, int) else "txt" if isinstance(label, str) else "json"
                )
                sink.write(
                    {
                        "__key__": f"s{i:04d}",
                        "png": images[i],
                        kind: json.dumps(label).encode() if kind == "json" else label,
                    }
                )
    return True


def damage_one_record(root: Path, src: Path) -> None:
    """Flip one byte of the first record's stored image bytes (the index is left as it was)."""
    row = json.loads((root / "index.jsonl").read_text(encoding="utf-8").splitlines()[0])
    image = (src / row["path"]).read_bytes()
    data = root / "shard-00000" / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(image) + len(image) // 2
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))


def make_inputs(work: Path) -> dict[str, Path]:
    """Write every input under `work` with this tree's packer; return them by case name."""
    src = work / "src"
    rels = make_tree(src)
    text = work / "text.tsv"
    text.write_text(
        "".join(f'{rel}\tword "{i}" \\ ü\n' for i, rel in enumerate(rels)), encoding="utf-8"
    )
    multi = work / "multi.jsonl"
    multi.write_text(
        "".join(
            json.dumps({"path": rel, "label": [i / 2, 1.0] if i % 3 else {"k": i}}) + "\n"
            for i, rel in enumerate(rels)
        )
    )
    magic = work / "magic-src"
    make_magic_tree(magic)
    inputs: dict[str, Path] = {}
    builds = {
        "ours-lmdb": [str(src), "--format", "lmdb", "--shard-size", "20KB"],
        "ours-recordio": [str(src), "--format", "recordio", "--shard-size", "20KB"],
        "ours-text": [str(src), "--labels", str(text), "--format", "lmdb"],
        "ours-multi": [str(src), "--labels", str(multi), "--format", "recordio"],
        "ours-none": [str(src), "--labels", "none", "--format", "recordio"],
        "ours-raw-magic": [str(magic), "--format", "lmdb", "--encode", "raw"],
        "ours-raw-lz4": [str(src), "--format", "recordio", "--encode", "raw", "--compress", "lz4"],
        "ours-damaged": [str(src), "--format", "lmdb"],
    }
    for case, options in builds.items():
        out = work / "in" / case
        run_packer(
            ROOT, "build", options[0], str(out), *options[1:], "--workers", "1", "--no-progress"
        )
        inputs[case] = out
    damage_one_record(inputs["ours-damaged"], src)
    images = [(src / rel).read_bytes() for rel in rels if rel.endswith(".png")][:8]
    write_scene_text_lmdb(work / "in" / "bare-lmdb", images, [f"t{i} ü" for i in range(8)])
    inputs["bare-lmdb"] = work / "in" / "bare-lmdb"
    labels = [float(j % 3) for j in range(len(images))]
    write_mxnet_rec(work / "in" / "bare-rec", images, labels, insightface=True)
    inputs["bare-rec"] = work / "in" / "bare-rec.rec"
    if write_tars(work / "in" / "wds", images):
        inputs["wds"] = work / "in" / "wds"
    return inputs


def compare(rev: str, work: Path, only: str | None) -> list[str]:
    """Convert every case with `rev` and with this tree under `work`; the differences found."""
    inputs = make_inputs(work)
    if only is not None:
        inputs = {k: v for k, v in inputs.items() if k == only}
    found: list[str] = []
    with checked_out(rev, work / "rev") as old_tree:
        for case, path in inputs.items():
            for target in TARGETS:
                name = f"{case}-to-{target}"
                old_out, new_out = work / "out-rev" / name, work / "out-tree" / name
                for tree, out in ((old_tree, old_out), (ROOT, new_out)):
                    out.parent.mkdir(exist_ok=True)
                    shutil.rmtree(out, ignore_errors=True)
                    options = ["--format", target, "--shard-size", SHARD_SIZE, "--no-progress"]
                    run_packer(tree, "convert", str(path), str(out), *options)
                found += [f"{name}/{line}" for line in compare_outputs(old_out, new_out)]
    return found


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when the converts are identical."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=DEFAULT_REV, help="the revision to compare with")
    parser.add_argument("--keep", type=Path, help="work under this directory and keep it")
    parser.add_argument("--only", help="only this input case (e.g. ours-lmdb)")
    args = parser.parse_args(argv)
    return run_comparison(
        lambda work: compare(args.rev, work, args.only), args.keep, "compare-converts-"
    )


if __name__ == "__main__":
    sys.exit(main())
