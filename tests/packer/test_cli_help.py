"""``packer --help``, each ``packer CMD --help`` and ``packer --version``: what newcomers read."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

import packer
from packer.cli import app
from packer.config import usable_cores

runner = CliRunner()

COMMANDS = {  # command -> its usage line after "Usage: packer CMD [OPTIONS]"
    "build": "SRC OUT",
    "verify": "OUT",
    "info": "OUT",
    "bench": "OUT",
    "stage": "OUT DIR",
    "convert": "IN... OUT",
    "append": "OUT SRC",
    "merge": "OUT SRC...",
    "split": "OUT DIR",
    "dupes": "OUT [OTHER...]",
}


def help_of(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], prog_name="packer")
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_covered():
    assert set(COMMANDS) == set(re.findall(r"^  (\w+) ", help_of().split("Commands:")[1], re.M))


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_shows_metavars_without_type_tags(command):
    text = help_of(*([command] if command else []))
    for noise in ("<str>", "<bool>", "<int>", "<path>", "<float>", "<list", "{"):
        assert noise not in text, (command, noise)
    if command:
        assert f"Usage: packer {command} [OPTIONS] {COMMANDS[command]}\n" in text
    options = text.split("Options:")[1]
    # every option that takes a value names it (--shard-size SIZE), none shows a bare TEXT
    assert " TEXT" not in options
    for line in options.splitlines():
        match = re.match(r"  (?:-\w, )?(--[\w-]+)( [^ ].*?)?(  |$)", line)
        if match and " / " not in line and match.group(1) not in ("--help", "--version"):
            flags = ("--json", "--deep", "--near", "--stratify", "--overwrite", "--check")
            assert match.group(2) or match.group(1) in flags, (command, line)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_option_states_two_defaults(command):
    text = " ".join(help_of(command).split())  # unwrapped
    for entry in re.split(r" (?=--[\w-]+[ ,])", text.split("Options:")[1]):
        assert not ("(default" in entry and "[default:" in entry), (command, entry)


def test_workers_says_how_many_cores_it_will_use():
    cores = usable_cores()
    text = " ".join(help_of("build").split())
    assert (
        "--workers N Processes that read and check images (at most the usable cores). "
        "[default: all usable cores, "
    ) in text
    assert f"all usable cores, {cores} here]" in text
    assert "[default: 0]" not in text
    assert f"{cores} here" in " ".join(help_of("append").split())
    assert f"0 to the usable cores ({cores} here)" in " ".join(help_of("bench").split())


def test_build_help_names_the_values():
    text = help_of("build")
    for shown in (
        "--shard-size SIZE",
        "--workers N",
        "--labels SOURCE",
        "--class-map auto|FILE",
        "-f, --format lmdb|recordio",
        "--encode keep|jpeg|png|raw",
        "--decode-check / --no-decode-check",
    ):
        assert shown in text, shown
    assert "Arguments:\n  SRC  " in text


def test_bench_defaults_match_the_library():
    from packer.bench import DEFAULT_SECONDS, MIN_ROUNDS, STABLE_SPREAD

    text = " ".join(help_of("bench").split())
    assert f"[default: {DEFAULT_SECONDS:g} when --batches is not given]" in text
    assert f"more than {STABLE_SPREAD:.0%}. [default: {MIN_ROUNDS}]" in text


def test_no_command_prints_the_help():
    result = runner.invoke(app, [], prog_name="packer")
    assert result.exit_code == 2
    assert result.output == help_of()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"packer {version('paddle-packer')}\n"
    assert version("paddle-packer") == packer.__version__  # the same release either way
