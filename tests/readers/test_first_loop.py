"""A first training loop on images of mixed sizes: `ResizeTo`, `pad_collate`, ``ds.classes``.

Every loader here is a real ``paddle.io.DataLoader`` with ``num_workers=2`` over a packed
dataset of mixed-size PNG/JPEG images (some of them gray), as a user's first script has it.
"""

from __future__ import annotations

import io
import pickle
import tarfile

import numpy as np
import paddle
import pytest
from paddle.io.dataloader.collate import default_collate_fn

from packer.build import build
from packer.config import BuildConfig
from readers import (
    ChunkShuffleBatchSampler,
    ConcatDataset,
    PadCollate,
    ResizeTo,
    open_dataset,
    pad_collate,
)
from readers.datasets.webdataset import WebDatasetDataset
from tests.conftest import encode, make_image, write_tree
from tests.readers.test_lmdb_dataset import write_bare_lmdb


def loader(ds, **kwargs):
    return paddle.io.DataLoader(ds, num_workers=2, **kwargs)


def test_the_default_collate_cannot_stack_mixed_sizes(packed):
    """Why the two tools exist: ``transform=None`` and the default collate fail here."""
    ds = open_dataset(packed.path)
    assert len({ds[i][0].shape for i in range(len(ds))}) > 1
    # (paddle's DataLoader hangs on a collate error rather than raising it: call the collate)
    with pytest.raises(ValueError, match="same shape"):
        default_collate_fn([ds[i] for i in range(len(ds))])


def test_resize_to_makes_the_default_collate_work(packed):
    ds = open_dataset(packed.path, transform=ResizeTo((12, 20)))
    batches = ChunkShuffleBatchSampler(ds, batch_size=4, seed=1)
    expected = [np.stack([ds[i][0] for i in ids]) for ids in batches]
    got = [(images.numpy(), labels.numpy()) for images, labels in loader(ds, batch_sampler=batches)]
    assert len(got) == len(expected) == 3
    for (images, labels), want, ids in zip(got, expected, batches, strict=True):
        assert images.shape == (len(ids), 12, 20, 3)
        assert images.dtype == np.uint8
        np.testing.assert_array_equal(images, want)
        assert labels.tolist() == [ds[i][1] for i in ids]


def test_pad_collate_returns_the_images_and_their_widths(packed):
    ds = open_dataset(packed.path)
    batches = ChunkShuffleBatchSampler(ds, batch_size=4, seed=2)
    seen = []
    for (images, labels, widths), ids in zip(
        loader(ds, batch_sampler=batches, collate_fn=pad_collate), batches, strict=True
    ):
        images, widths = images.numpy(), widths.numpy()
        originals = [ds[i][0] for i in ids]
        assert images.dtype == np.uint8
        assert images.shape[0] == len(ids)
        assert images.shape[1:] == (
            max(o.shape[0] for o in originals),
            max(o.shape[1] for o in originals),
            3,
        )
        assert widths.tolist() == [o.shape[1] for o in originals]
        for image, original in zip(images, originals, strict=True):
            h, w = original.shape[:2]
            np.testing.assert_array_equal(image[:h, :w], original)
            assert not image[h:].any()
            assert not image[:, w:].any()
        assert labels.numpy().tolist() == [ds[i][1] for i in ids]
        seen += ids
    assert sorted(seen) == list(range(len(ds)))


def test_pad_collate_keeps_text_labels_and_gives_heights(tree, tmp_path):
    src, files = tree
    listing = tmp_path / "labels.txt"
    listing.write_text("".join(f"{name}\tword {n}\n" for n, name in enumerate(sorted(files))))
    out = tmp_path / "ocr.lmdb"
    build(BuildConfig(src=src, out=out, labels=str(listing)))
    ds = open_dataset(out, decode="gray")
    collate = PadCollate(255, heights=True, multiple=8)
    got = list(loader(ds, batch_size=4, collate_fn=collate))
    assert [len(b[1]) for b in got] == [4, 4, 3]
    texts = [t for _, labels, _, _ in got for t in labels]
    assert texts == [ds[i][1] for i in range(len(ds))] == [f"word {n}" for n in range(11)]
    images, _, widths, heights = got[2]
    originals = [ds[i][0] for i in range(8, 11)]
    assert heights.numpy().tolist() == [o.shape[0] for o in originals]
    assert widths.numpy().tolist() == [o.shape[1] for o in originals]
    assert images.shape[1] % 8 == 0
    assert images.shape[2] % 8 == 0
    assert images.shape[3] == 1
    assert (images.numpy()[0, heights.numpy()[0] :] == 255).all()


def test_pad_collate_layouts_labels_and_mistakes():
    a = np.arange(2 * 3 * 3, dtype=np.float32).reshape(3, 2, 3)  # CHW: 3 x 2 x 3
    b = np.ones((3, 4, 1), dtype=np.float32)  # CHW: 3 x 4 x 1
    images, labels, widths = PadCollate(-1.0, layout="CHW")([(a, [1, 2]), (b, [3, 4])])
    assert images.shape == (2, 3, 4, 3)
    assert images.dtype == np.float32
    np.testing.assert_array_equal(images[0, :, :2, :3], a)
    assert (images[1, :, :, 1:] == -1).all()
    assert (images[0, :, 2:] == -1).all()
    assert widths.tolist() == [3, 1]
    assert labels.dtype == np.float32
    gray = np.zeros((2, 5), np.uint8)
    images, labels, widths = pad_collate([(gray, None), (gray[:, :3], {"a": 1})])
    assert images.shape == (2, 2, 5, 1)
    assert labels == [None, {"a": 1}]
    with pytest.raises(ValueError, match="sample 1 has 1 channels of uint8, sample 0 has 3"):
        pad_collate([(np.zeros((2, 2, 3), np.uint8), 0), (gray, 1)])
    with pytest.raises(ValueError, match="sample 0 of the batch is a Tensor, not an HxW"):
        pad_collate([(paddle.zeros([2, 2]), 0)])
    with pytest.raises(ValueError, match="multiple=0: expected an int >= 1"):
        PadCollate(multiple=0)
    with pytest.raises(ValueError, match="layout='NHWC': expected 'HWC' or 'CHW'"):
        PadCollate(layout="NHWC")


def test_resize_to_stretches_or_keeps_the_aspect_and_pads():
    rng = np.random.default_rng(0)
    wide = make_image(rng, 40, 10)  # 10 x 40 x 3
    assert ResizeTo((16, 24))(wide).shape == (16, 24, 3)
    assert ResizeTo(8)(wide).shape == (8, 8, 3)
    boxed = ResizeTo((16, 16), keep_aspect=True, pad_value=7)(wide)
    assert boxed.shape == (16, 16, 3)
    assert ResizeTo((16, 16), keep_aspect=True).fitted_size(10, 40) == (4, 16)
    assert (boxed[4:] == 7).all()
    assert not (boxed[:4] == 7).all()
    gray = make_image(rng, 5, 9)[:, :, :1]  # 9 x 5 x 1 stays one channel
    assert ResizeTo((18, 10))(gray).shape == (18, 10, 1)
    assert ResizeTo((18, 10), keep_aspect=True).fitted_size(9, 5) == (18, 10)
    same = ResizeTo((10, 40))(wide)
    np.testing.assert_array_equal(same, wide)
    with pytest.raises(ValueError, match=r"size=\(0, 3\): expected a positive int"):
        ResizeTo((0, 3))
    with pytest.raises(ValueError, match="interpolation='cubic': expected one of nearest"):
        ResizeTo(4, interpolation="cubic")
    with pytest.raises(ValueError, match=r"HxWxC numpy image, got \(1, 2, 3, 4\); put it"):
        ResizeTo(4)(np.zeros((1, 2, 3, 4), np.uint8))


def test_the_tools_pickle_for_spawned_workers():
    for tool in (pad_collate, PadCollate(3, heights=True), ResizeTo((4, 5), keep_aspect=True)):
        copy = pickle.loads(pickle.dumps(tool))
        assert repr(copy) == repr(tool)
    assert pickle.loads(pickle.dumps(pad_collate)) is not None


def test_classes_and_num_classes_of_every_dataset(packed, tmp_path):
    ds = open_dataset(packed.path)
    assert ds.classes == ["cat", "dog", "eel"]
    assert ds.num_classes == 3
    assert pickle.loads(pickle.dumps(ds)).classes == ["cat", "dog", "eel"]
    assert ds.classes[ds[10][1]] == "eel"

    other_src = tmp_path / "other"
    write_tree(other_src, {"dog": 1, "fox": 2}, seed=3)
    build(BuildConfig(src=other_src, out=tmp_path / "other.lmdb"))
    other = open_dataset(tmp_path / "other.lmdb")
    assert ConcatDataset([ds, open_dataset(packed.path)]).classes == ["cat", "dog", "eel"]
    assert ConcatDataset([ds, open_dataset(packed.path)]).num_classes == 3
    kept = ConcatDataset([ds, other])
    assert kept.classes is None
    assert kept.num_classes is None
    union = ConcatDataset([ds, other], classes="union")
    assert union.classes == ["cat", "dog", "eel", "fox"]
    assert union.num_classes == 4


def test_datasets_without_class_names(tmp_path):
    files = write_tree(tmp_path / "src", {"w": 2})
    write_bare_lmdb(tmp_path / "bare", [files[k] for k in sorted(files)], ["a", "b"])
    bare = open_dataset(tmp_path / "bare")
    assert bare.classes is None
    assert bare.num_classes is None

    out = tmp_path / "nolabels.rec"
    build(BuildConfig(src=tmp_path / "src", out=out, format="recordio", labels="none"))
    assert open_dataset(out).classes is None

    tar = tmp_path / "tars" / "part-0.tar"
    tar.parent.mkdir()
    with tarfile.open(tar, "w") as sink:
        for key, data in (("a", encode(make_image(np.random.default_rng(1), 4, 3), ".png")),):
            for name, payload in ((f"{key}.png", data), (f"{key}.cls", b"2")):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                sink.addfile(info, io.BytesIO(payload))
    web = WebDatasetDataset(tar.parent)
    assert web[0][1] == 2
    assert web.classes is None
    assert web.num_classes is None


def test_the_batch_sampler_tells_its_chunk_size(packed):
    ds = open_dataset(packed.path)
    assert ChunkShuffleBatchSampler(ds, batch_size=4, chunk_size=3).chunk_size == 3
    resolved = ChunkShuffleBatchSampler(ds, batch_size=4)
    assert resolved.chunk_size == resolved.sampler.chunk_size >= 1


def test_a_first_loop_trains_on_mixed_sizes(packed):
    """The docs' first loop, in short: resize, batch, a small model's loss goes down."""
    paddle.seed(0)
    ds = open_dataset(packed.path, transform=ResizeTo((16, 16)))
    model = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(16 * 16 * 3, ds.num_classes))
    opt = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    batches = ChunkShuffleBatchSampler(ds, batch_size=4, seed=0)
    losses = []
    for epoch in range(3):
        batches.set_epoch(epoch)
        for images, labels in loader(ds, batch_sampler=batches):
            loss = paddle.nn.functional.cross_entropy(model(images.astype("float32") / 255), labels)
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses.append(float(loss))
    assert len(losses) == 9
    assert np.isfinite(losses).all()
