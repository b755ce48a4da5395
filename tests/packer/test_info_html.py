"""``packer info OUT --html FILE`` rendered in a real browser (headless Chromium, Debian's
``chromium`` package): a screenshot that is not blank, and a DOM whose sections are all there
and filled, every thumbnail a decodable inline image, and nothing fetched from a network.
The same checks are run on deliberately broken pages, to show that they can fail."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.report_html import THUMBS_PER_CLASS, pick_thumbnails
from readers.index import load_index
from tests.conftest import build_packed

runner = CliRunner()
SECTIONS = ("summary", "labels", "sizes", "thumbnails", "problems", "shards")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "headless Chromium is needed to test the --html page: "
        "apt-get install -y chromium (Debian's package; .ci/run installs it)"
    )


def _run_browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class _Sections(HTMLParser):
    """Per <section id=...>: its text length, its images' src, its SVG bars and table rows."""

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None
        self.text: dict[str, int] = {}
        self.images: dict[str, list[str]] = {}
        self.shapes: dict[str, int] = {}
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key):
                self.links.append(str(a[key]))
        if tag == "section":
            self.current = a.get("id") or "?"
            self.text.setdefault(self.current, 0)
            self.images.setdefault(self.current, [])
            self.shapes.setdefault(self.current, 0)
        elif self.current is not None:
            if tag == "img":
                self.images[self.current].append(a.get("src") or "")
            elif tag in ("rect", "td"):
                self.shapes[self.current] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.current is not None:
            self.text[self.current] += len(data.strip())


def page_problems(page: Path, tmp: Path) -> list[str]:
    """What is wrong with `page` as Chromium renders it (empty: a page worth looking at)."""
    problems = []
    shot = tmp / f"{page.stem}.png"
    done = _run_browser(f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri())
    image = cv2.imread(str(shot)) if shot.exists() else None
    if image is None:
        problems.append(f"no screenshot ({done.stderr[-500:]})")
    elif float(image.std()) < 10:
        problems.append(f"the screenshot is blank (pixel std {image.std():.1f})")
    dom = _run_browser("--dump-dom", page.as_uri())
    if done.returncode or dom.returncode or "<html" not in dom.stdout:
        problems.append(f"chromium failed: {dom.stderr[-500:]}")
        return problems
    parsed = _Sections()
    parsed.feed(dom.stdout)
    for name in SECTIONS:
        if name not in parsed.text:
            problems.append(f"section {name} is missing")
        elif parsed.text[name] < 10 + len(name):
            problems.append(f"section {name} is empty")
    if not parsed.images.get("thumbnails"):
        problems.append("no thumbnails")
    for src in (s for imgs in parsed.images.values() for s in imgs):
        match = re.fullmatch(r"data:image/jpeg;base64,([A-Za-z0-9+/=]+)", src)
        decoded = (
            cv2.imdecode(
                np.frombuffer(base64.b64decode(match.group(1)), np.uint8), cv2.IMREAD_COLOR
            )
            if match
            else None
        )
        if decoded is None:
            problems.append(f"an <img> without a decodable inline image: {src[:60]!r}")
    for name in ("labels", "sizes", "shards"):
        if parsed.shapes.get(name, 0) == 0:
            problems.append(f"section {name} has no bars or rows")
    problems += [f"a network reference: {link[:80]}" for link in parsed.links if "http" in link]
    return problems


@pytest.fixture
def page(tmp_path: Path) -> Path:
    """The --html page of a small dataset with three classes and one undecodable input."""
    from tests.conftest import write_tree

    src = tmp_path / "src"
    write_tree(src, {"cat": 10, "dog": 5, "eel": 2})
    (src / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    html = tmp_path / "report.html"
    result = runner.invoke(app, ["info", str(out), "--html", str(html)])
    assert result.exit_code == 0, result.output
    return html


def test_the_page_renders_in_chromium_with_every_section(page: Path, tmp_path: Path) -> None:
    assert page_problems(page, tmp_path) == []
    text = page.read_text()
    assert text.count("<img ") == THUMBS_PER_CLASS + 5 + 2  # cat capped, dog and eel whole
    assert "cat/broken.jpg" in text  # the error ...
    assert "truncated" in text  # ... and its reason
    assert "http" not in text  # not even an SVG namespace: nothing to fetch


def test_broken_pages_fail_the_same_checks(page: Path, tmp_path: Path) -> None:
    text = page.read_text()
    no_images = tmp_path / "no_images.html"
    no_images.write_text(re.sub(r'src="data:[^"]*"', 'src="missing.jpg"', text))
    problems = page_problems(no_images, tmp_path)
    assert any("decodable inline image" in p for p in problems)

    empty = tmp_path / "empty_section.html"
    empty.write_text(
        re.sub(r"<section id=sizes>.*?</section>", "<section id=sizes></section>", text)
    )
    assert "section sizes is empty" in page_problems(empty, tmp_path)

    remote = tmp_path / "remote.html"
    remote.write_text(text.replace("<main>", '<main><img src="http://example.com/a.jpg">'))
    assert any("network reference" in p for p in page_problems(remote, tmp_path))

    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    problems = page_problems(blank, tmp_path)
    assert any("blank" in p for p in problems)
    assert "section summary is missing" in problems


def test_thumbnails_are_chosen_deterministically(tmp_path: Path) -> None:
    from tests.conftest import write_tree

    src = tmp_path / "src"
    write_tree(src, {"a": 20, "b": 3})
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    index = load_index(out)
    picked = pick_thumbnails(index, ["a", "b"])
    assert [name for name, _ in picked] == ["a (20)", "b (3)"]
    assert picked[0][1].tolist() == [0, 3, 5, 8, 11, 14, 16, 19]  # spread over the class
    assert picked[1][1].tolist() == [20, 21, 22]
    again = pick_thumbnails(load_index(out), ["a", "b"])
    assert [ids.tolist() for _, ids in again] == [ids.tolist() for _, ids in picked]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_html_refuses_a_file_of_a_dataset(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """``--html`` pointed at a dataset's meta.json destroyed the dataset; anywhere inside this
    dataset or another one, and a file with a second hard link, is refused now."""
    src, _ = tree
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    other = build_packed(src, tmp_path / "other.rec", "recordio")
    before = _snapshot(tmp_path)
    linked = tmp_path / "linked.html"
    linked.write_text("old page")
    os.link(linked, tmp_path / "second-name.html")
    (tmp_path / "a-dir.html").mkdir()
    bare = tmp_path / "bare"  # a bare LMDB: no meta.json to recognise it by
    shutil.copytree(out / "shard-00000", bare)
    cases = [
        (out / "meta.json", "lies inside the dataset .* it describes"),
        (out / "shard-00000" / "data.mdb", "lies inside the dataset .* it describes"),
        (out / "new.html", "lies inside the dataset .* it describes"),
        (other / "meta.json", f"lies inside the packer dataset {other}"),
        (other / "shard-00000.rec", f"lies inside the packer dataset {other}"),
        (linked, "has 2 hard links"),
        (tmp_path / "a-dir.html", "exists and is not a regular file"),
        (bare / "data.mdb", "exists and is named as a dataset's file is"),
    ]
    for target, message in cases:
        result = runner.invoke(app, ["info", str(out), "--html", str(target)])
        assert result.exit_code == 2, (target, result.output)
        assert re.search(
            f"packer: error: --html {re.escape(str(target))}: {message}", result.output
        )
        assert "nothing was written" in result.output
    assert {k: v for k, v in _snapshot(tmp_path).items() if k in before} == before
    assert linked.read_text() == "old page"
    assert not (out / "new.html").exists()
    assert not list(tmp_path.rglob(".*.tmp"))


def test_html_is_written_through_a_new_file_and_a_rename(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = tree
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    report = tmp_path / "reports" / "report.html"
    report.parent.mkdir()
    report.write_text("old page")
    with open(report, encoding="utf-8") as old:  # a reader of the old page keeps it whole
        inode = os.stat(report).st_ino
        result = runner.invoke(app, ["info", str(out), "--html", str(report)])
        assert result.exit_code == 0, result.output
        assert old.read() == "old page"
    assert os.stat(report).st_ino != inode  # a new file renamed over the old one
    assert report.read_text().startswith("<!DOCTYPE html>")
    assert os.stat(report).st_nlink == 1
    assert sorted(p.name for p in report.parent.iterdir()) == ["report.html"]
