"""packer bench's decode section: measured through the CLI on real PNG, JPEG and raw datasets
(numbers present, no timing asserts), and the pure parts: the draft scale and the advice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.bench.decoding import (
    MAX_GROWTH,
    RAW_OPTION,
    DecodeOption,
    FormatCost,
    advise,
    cost_options,
    draft_scale,
    sample_ids,
)
from packer.cli import app
from tests.packer.test_bench import FAST, write_fixed

runner = CliRunner()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("bench-decoding") / "src"
    write_fixed(src, {"a": 10, "b": 10})  # 16x16, PNG and JPEG alternating
    return src


def build(src: Path, out: Path, *args: str) -> Path:
    result = runner.invoke(
        app, ["build", str(src), str(out), *args, "--workers", "1", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module", params=["keep", "png", "jpeg"])
def stored(request: pytest.FixtureRequest, source: Path, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(f"enc-{request.param}") / "out.lmdb"
    return str(request.param), build(source, out, "--encode", request.param)


def bench(out: Path, *args: str) -> str:
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0", *args])
    assert result.exit_code == 0, result.output
    return str(result.stdout)


def section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("decoding: "))
    return lines[start:]


def test_the_section_has_numbers_for_each_stored_format(stored):
    encode, out = stored
    expected = {"keep": {"png", "jpeg"}, "png": {"png"}, "jpeg": {"jpeg"}}[encode]
    lines = section(bench(out, "--draft", "8"))
    assert lines[0].startswith("decoding: 20 of 20 samples, decode rgb")
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.split()[0] in expected}
    assert set(rows) == expected
    for name, cells in rows.items():  # stored, share, mean size (2 cells), decode, ...
        assert cells[3] == "kB"
        assert float(cells[4].replace(",", "")) > 0  # decode us
        assert float(cells[5].replace(",", "")) > 0  # raw+lz4 us
        assert cells[6].startswith("(")  # its size
        assert cells[6].endswith("x)")
        if name == "jpeg":  # 16 px JPEGs at draft=8: every one at 1/2
            assert float(cells[7].replace(",", "")) > 0
            assert cells[8:] == ["(100%", "reduced)"]
        else:
            assert cells[7] == "-"
    last = lines[-1]
    assert last.startswith("decoding is ")
    assert "% of a sample's time" in last


def test_json_carries_the_measurements_and_the_advice(stored):
    _, out = stored
    result = runner.invoke(
        app, ["bench", str(out), *FAST, "--workers", "0", "--draft", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)["decoding"]
    assert (d["samples"], d["of"], d["draft"]) == (20, 20, 8)
    formats = {f["stored"]: f for f in d["formats"]}
    assert sum(f["samples"] for f in formats.values()) == 20
    for name, f in formats.items():
        assert min(f["decode_us"], f["raw_lz4_us"], f["raw_lz4_bytes"]) > 0
        assert (f["draft_us"] is not None) == (name == "jpeg")
    names = {o["name"] for o in d["options"]}
    assert RAW_OPTION in names
    assert ("draft=8" in names) == ("jpeg" in formats)
    assert d["sample_us"] > 0
    assert 0 < d["decode_share"] <= 1
    assert d["recommendation"] == advise(
        [DecodeOption(**o) for o in d["options"]],
        decode_us=d["decode_us"],
        sample_us=d["sample_us"],
    )


@pytest.mark.parametrize("encode", ["keep", "jpeg"])  # both store JPEGs
def test_a_draft_larger_than_the_images_changes_nothing(encode, source, tmp_path):
    out = build(source, tmp_path / "out.lmdb", "--encode", encode)
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0", "--json"])
    d = json.loads(result.stdout)["decoding"]
    (jpeg,) = [f for f in d["formats"] if f["stored"] == "jpeg"]
    assert jpeg["draft_reduced"] == 0.0  # 16 px images, draft=256: decoded at full size
    assert all(not o["name"].startswith("draft=") for o in d["options"])


def test_raw_records_have_no_alternative(source, tmp_path):
    out = build(source, tmp_path / "raw.recordio", "--format", "recordio", "--encode", "raw")
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)["decoding"]
    assert [f["stored"] for f in d["formats"]] == ["raw"]
    assert d["formats"][0]["raw_lz4_us"] is None
    assert d["options"] == []
    assert "neither" in d["recommendation"] or "save little" in d["recommendation"]


def test_decode_samples_0_skips_the_section_and_bytes_decode_nothing(stored):
    _, out = stored
    assert "decoding: " not in bench(out, "--decode-samples", "0")
    lines = section(bench(out, "--decode", "bytes"))
    assert "the loader decodes nothing" in "\n".join(lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--draft", "0"], "--draft 0"), (["--decode-samples", "-1"], "--decode-samples -1")],
)
def test_bad_decode_options_exit_2(stored, args, message):
    _, out = stored
    result = runner.invoke(app, ["bench", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


# ------------------------------------------------------------------ pure parts


def test_draft_scale_keeps_the_shorter_side_at_least_the_draft():
    assert draft_scale(4000, 3000, 256) == 8  # 375 >= 256
    assert draft_scale(1024, 768, 256) == 2  # 1/4 would give 192
    assert draft_scale(1024, 1024, 256) == 4
    assert draft_scale(300, 500, 256) == 1  # already small: full size
    assert draft_scale(16, 16, 8) == 2
    assert draft_scale(17, 40, 9) == 2  # ceil(17 / 2) = 9: the shorter side decides
    assert draft_scale(17, 40, 10) == 1


def test_sample_ids_are_a_fixed_sorted_draw():
    a = sample_ids(10_000, 256, seed=0)
    assert a.tolist() == sorted(set(a.tolist()))
    assert a.size == 256
    assert (a == sample_ids(10_000, 256, seed=0)).all()
    assert sample_ids(5, 256).tolist() == [0, 1, 2, 3, 4]


RAW = DecodeOption(RAW_OPTION, 7.0, 1.5)
DRAFT = DecodeOption("draft=256", 40.0, 1.0)


def test_advice_names_the_option_that_saves_most():
    line = advise([RAW, DRAFT], decode_us=95.0, sample_us=128.0)
    assert line == (
        "decoding is 74% of a sample's time; --encode raw --compress lz4 would cut it from "
        "95 us to 7 us per sample at 1.50x the stored size"
    )
    faster_draft = DecodeOption("draft=256", 5.0, 1.0)
    assert "draft=256 would cut it from 95 us to 5 us" in advise(
        [RAW, faster_draft], decode_us=95.0, sample_us=128.0
    )


def test_advice_prefers_draft_when_raw_pixels_grow_the_data_too_much():
    bulky = DecodeOption(RAW_OPTION, 7.0, MAX_GROWTH + 1)
    assert "draft=256 would cut it from 95 us to 40 us" in advise(
        [bulky, DRAFT], decode_us=95.0, sample_us=128.0
    )
    alone = advise([bulky], decode_us=95.0, sample_us=128.0)  # nothing else helps: say it
    assert f"{RAW_OPTION} would cut it" in alone
    assert "4.00x the stored size" in alone


def test_advice_when_nothing_pays():
    cheap = advise([RAW, DRAFT], decode_us=10.0, sample_us=100.0)
    assert (
        cheap
        == "decoding is 10% of a sample's time: storing or decoding differently would save little"
    )
    small = advise([DecodeOption(RAW_OPTION, 80.0, 1.2)], decode_us=95.0, sample_us=128.0)
    assert small.endswith("neither --encode raw --compress lz4 nor draft= would cut it by 25%")
    unknown = advise([RAW], decode_us=95.0, sample_us=None)
    assert unknown.startswith("decoding takes 95 us per sample; --encode raw")


def test_options_are_weighted_by_the_formats_shares():
    png = FormatCost("png", 128, 0.5, 5_000.0, 100.0, raw_lz4_us=10.0, raw_lz4_bytes=7_500.0)
    jpeg = FormatCost(
        "jpeg", 128, 0.5, 20_000.0, 300.0, 20.0, 60_000.0, draft_us=100.0, draft_reduced=1.0
    )
    now, options = cost_options([png, jpeg], draft=256)
    assert now == pytest.approx(200.0)
    by_name = {o.name: o for o in options}
    assert by_name[RAW_OPTION].decode_us == pytest.approx(15.0)
    assert by_name[RAW_OPTION].size_ratio == pytest.approx(67_500 / 25_000)
    assert by_name["draft=256"].decode_us == pytest.approx(100.0)  # PNGs unchanged
    assert by_name["draft=256"].size_ratio == 1.0
    _, none = cost_options([FormatCost("raw", 10, 1.0, 768.0, 2.0)], draft=256)
    assert none == []
