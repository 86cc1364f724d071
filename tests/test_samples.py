"""deploy/*.toml and the settings part of every command's README.md are generated from the settings structs
(`make samples`): a committed copy that drifted from the structs fails here."""

from __future__ import annotations

import tomllib

import pytest

from hpcbus.commands.dev import samples


@pytest.mark.parametrize("path", sorted(samples.outputs()), ids=lambda p: str(p.relative_to(samples.ROOT)))
def test_committed_copy_is_what_the_structs_generate(path) -> None:
    expected = samples.outputs()[path]
    assert path.read_text() == expected, f"{path.relative_to(samples.ROOT)} drifted: run `make samples`"


def test_every_command_folder_has_a_readme() -> None:
    found = [*samples.ROOT.glob("*/*/command.py"), *samples.ROOT.glob("hpcbus/commands/*/command.py")]
    folders = {p.parent.relative_to(samples.ROOT).as_posix() for p in found}
    assert folders == set(samples.COMMANDS)


@pytest.mark.parametrize("folder", sorted(samples.COMMANDS))
def test_readme_sample_config_is_valid_toml(folder: str) -> None:
    text = (samples.ROOT / folder / "README.md").read_text()
    block = text.split("```toml\n")[-1].split("```")[0]
    assert tomllib.loads(block.replace("# ", "")) is not None  # commented defaults, uncommented: valid


def test_splice_keeps_the_handwritten_part() -> None:
    part = samples.BEGIN + "\nnew\n" + samples.END + "\n"
    text = "# title\n\nprose\n\n" + samples.BEGIN + "\nold\n" + samples.END + "\n\n## after\n"
    assert samples.splice(text, part) == "# title\n\nprose\n\n" + part + "\n## after\n"
    assert samples.splice("# title\n", part) == "# title\n\n" + part
