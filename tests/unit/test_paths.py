"""Server-side ingest paths: off by default, confined to roots, regular files only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragline.errors import InvalidArgument, PermissionDenied
from services.paths import PathPolicy

pytestmark = pytest.mark.unit


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "corpus"
    outside = tmp_path / "private"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    paths = {
        "root": root,
        "inside": root / "guide.pdf",
        "nested": root / "sub" / "notes.PDF",
        "text": root / "readme.txt",
        "outside": outside / "secret.pdf",
    }
    for name in ("inside", "nested", "text", "outside"):
        paths[name].write_bytes(b"%PDF-1.4 placeholder")
    (root / "escape.pdf").symlink_to(paths["outside"])  # a link leading out of the root
    (root / "again.pdf").symlink_to(paths["inside"])  # the same file twice
    (root / "sub" / "up").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe.pdf")  # reading it would block a parser forever
    return paths


def test_server_side_paths_are_refused_unless_roots_are_configured(tree) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PermissionDenied, match="RAGLINE_INGEST_PATH_ROOTS"):
        PathPolicy().files([str(tree["inside"])])
    assert PathPolicy().files([]) == []


def test_a_folder_expands_to_its_regular_pdfs_inside_the_root(tree) -> None:  # type: ignore[no-untyped-def]
    policy = PathPolicy.from_setting(str(tree["root"]))
    found = policy.files([str(tree["root"])])
    # no symlink out of the root, no FIFO, no text file; links to folders are not followed
    assert found == [tree["inside"].resolve(), tree["nested"].resolve()]


@pytest.mark.parametrize("name", ["outside", "escape", "missing", "fifo", "etc"])
def test_missing_and_forbidden_paths_get_one_answer(tree, name: str) -> None:  # type: ignore[no-untyped-def]
    policy = PathPolicy.from_setting(str(tree["root"]))
    raw = {
        "outside": str(tree["outside"]),
        "escape": str(tree["root"] / "escape.pdf"),
        "missing": str(tree["root"] / "nope.pdf"),
        "fifo": str(tree["root"] / "pipe.pdf"),
        "etc": "/etc/shadow",
    }[name]
    with pytest.raises(PermissionDenied) as info:
        policy.files([str(tree["inside"]), raw])
    assert info.value.message == (
        f"paths[1]: {raw}: not found, or not under a folder this server reads from"
    )


def test_dot_dot_cannot_climb_out_of_a_root(tree) -> None:  # type: ignore[no-untyped-def]
    policy = PathPolicy.from_setting(str(tree["root"]))
    with pytest.raises(PermissionDenied):
        policy.files([str(tree["root"] / ".." / "private" / "secret.pdf")])


def test_unprintable_and_oversized_paths_are_invalid_arguments(tree) -> None:  # type: ignore[no-untyped-def]
    policy = PathPolicy.from_setting(str(tree["root"]))
    for raw in ("bad\x00name.pdf", "x" * 5000, ""):
        with pytest.raises(InvalidArgument):
            policy.files([raw])


def test_a_root_that_is_not_a_folder_stops_the_start(tree) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="is not a folder"):
        PathPolicy.from_setting(f"{tree['root']}{os.pathsep}{tree['inside']}")


def test_a_huge_folder_tree_is_refused(tree, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import services.paths

    monkeypatch.setattr(services.paths, "MAX_ENTRIES", 3)
    policy = PathPolicy.from_setting(str(tree["root"]))
    with pytest.raises(InvalidArgument, match="more than 3 entries"):
        policy.files([str(tree["root"])])
