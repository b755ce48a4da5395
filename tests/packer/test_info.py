"""``packer info`` and ``packer verify`` on a malformed meta.json (issue 21): an error line or
an unknown value naming the field and the file, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from packer.cli import app

runner = CliRunner()

Meta = dict[str, Any]


def _drop_bytes(m: Meta) -> None:
    del m["shards"][0]["bytes"]


def _drop_sizes(m: Meta) -> None:
    del m["shards"][0]["bytes"]
    m["shards"][0].pop("file_bytes", None)


def _text_size(m: Meta) -> None:
    m["shards"][0]["file_bytes"] = "12 MB"


def _null_size(m: Meta) -> None:
    m["shards"][0]["bytes"] = None
    m["shards"][0]["file_bytes"] = None


def _classes_int(m: Meta) -> None:
    m["classes"] = 5


def _classes_object(m: Meta) -> None:
    m["classes"] = {"cat": 0}


# info shows these as unknown, with a problem line; verify reports them
SHOWN_UNKNOWN: list[tuple[Callable[[Meta], None], str]] = [
    (_drop_bytes, "shard 0 has no field 'bytes'"),
    (_drop_sizes, "shard 0 has no field 'bytes'"),
    (_text_size, "shard 0 has file_bytes '12 MB', expected an integer >= 0"),
    (_null_size, "shard 0 has bytes None, expected an integer >= 0"),
    (_classes_int, "classes is 5, expected a list of class names"),
    (_classes_object, "classes is {'cat': 0}, expected a list of class names"),
]


def _rewrite(path, mutate: Callable[[Meta], None]) -> None:
    meta = json.loads((path / "meta.json").read_text())
    mutate(meta)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(("mutate", "message"), SHOWN_UNKNOWN)
def test_info_shows_a_malformed_field_as_unknown(packed, mutate, message):
    _rewrite(packed.path, mutate)
    text = runner.invoke(app, ["info", str(packed.path)])
    assert text.exit_code == 0, text.output
    assert f"{packed.path / 'meta.json'}: {message}" in text.output
    assert "samples in 1 shard" in text.output
    as_json = runner.invoke(app, ["info", str(packed.path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.output)
    assert any(
        p.startswith(f"{packed.path / 'meta.json'}: {message}") for p in summary["meta_problems"]
    )
    assert summary["num_samples"] == len(packed.files)
    if mutate in (_drop_sizes, _text_size, _null_size):
        assert summary["disk_bytes"] is None
        assert "? MB" in text.output


@pytest.mark.parametrize(("mutate", "message"), SHOWN_UNKNOWN)
def test_verify_reports_a_malformed_field(packed, mutate, message):
    _rewrite(packed.path, mutate)
    result = runner.invoke(app, ["verify", str(packed.path)])
    assert result.exit_code == 1, result.output
    assert f"meta.json: {message}" in result.output


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.__setitem__("shards", {"0": {}}), "shards is dict, expected a list"),
        (lambda m: m["shards"][0].pop("count"), "shard 0 has count None"),
        (lambda m: m["shards"][0].__setitem__("count", "11"), "shard 0 has count '11'"),
        (lambda m: m["shards"][0].pop("name"), "shard 0 has name None"),
        (lambda m: m.__setitem__("num_samples", 1.5), "num_samples is 1.5"),
        (lambda m: m.pop("format"), "field 'format' is missing"),
    ],
)
def test_a_field_readers_need_is_an_error_line(packed, mutate, message):
    _rewrite(packed.path, mutate)
    result = runner.invoke(app, ["info", str(packed.path)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"packer: error: {packed.path / 'meta.json'}: {message}" in result.output
    result = runner.invoke(app, ["verify", str(packed.path)])
    assert result.exit_code == 1, result.output
    assert message in result.output


def test_info_of_an_intact_dataset_lists_no_problems(packed):
    summary = json.loads(runner.invoke(app, ["info", str(packed.path), "--json"]).output)
    assert summary["meta_problems"] == []
    assert summary["disk_bytes"] > 0
    text = runner.invoke(app, ["info", str(packed.path)]).output
    assert "problems" not in text
    assert "? MB" not in text


RAW_CLASSES = ["\x1b[31mred\r", "bell\x07\x9b2J", "\u202eevil"]


def _escape_classes(m: Meta) -> None:
    m["classes"] = RAW_CLASSES
    m["label_source"] = "dirname\x1b]0;title\x07"


def test_info_prints_class_names_escaped(packed):
    """Class names and meta.json's text reached the terminal raw (ESC sequences, CR); they are
    shown with repr-style escapes now, and --json stays JSON that gives them back unchanged."""
    _rewrite(packed.path, _escape_classes)
    result = runner.invoke(app, ["info", str(packed.path)])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\r", "\x07", "\x9b", "\u202e"):
        assert raw not in result.output
    assert "\\x1b[31mred\\r" in result.output
    assert "bell\\x07\\x9b2J" in result.output
    assert "\\u202eevil" in result.output
    assert "from dirname\\x1b]0;title\\x07;" in result.output
    as_json = runner.invoke(app, ["info", str(packed.path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert "\x1b" not in as_json.output
    summary = json.loads(as_json.output)
    assert summary["classes"] == RAW_CLASSES
    assert set(summary["labels"]) == set(RAW_CLASSES)


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain text, 日本語 and ü", "plain text, 日本語 and ü"),
        ("\x1b[31m", "\\x1b[31m"),
        ("a\rb\nc\td", "a\\rb\\nc\\td"),
        ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),
        ("\u2028\u202e\ud800", "\\u2028\\u202e\\ud800"),
        ("\u3000\u200d", "\u3000\u200d"),  # ideographic space, zero-width joiner: shown
        (7, "7"),
    ],
)
def test_shown_escapes_what_a_terminal_acts_on(text: Any, escaped: str) -> None:
    from packer.terminal import shown

    assert shown(text) == escaped
