"""Fetch the PDFs a ``corpus.json`` names from their Debian packages and check their sha256."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from ragline.errors import FailedPrecondition
from ragline.files import read_regular_text


class CorpusError(FailedPrecondition):
    """The corpus cannot be made: a manifest that does not read, a package that cannot be
    fetched, a PDF whose checksum differs (the CLI says it in one line)."""


MAX_MANIFEST_BYTES = 1 << 20
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy's package names
_VERSION = re.compile(r"[A-Za-z0-9.+~:-]+")


def read_manifest(manifest: Path) -> tuple[list[dict[str, str]], dict[str, dict[str, Any]]]:
    """The PDFs a ``corpus.json`` names and the packages they come from, checked: each PDF a
    plain file name, its path inside its package relative, a sha256, and a package (with an
    optional version) apt may be asked for (never an option).

    Raises:
        CorpusError: naming the manifest and what is wrong.
    """
    try:
        spec = json.loads(read_regular_text(manifest, "corpus manifest", MAX_MANIFEST_BYTES))
        pdfs, debs = spec["pdfs"], spec["debs"]
        if not isinstance(pdfs, list) or not isinstance(debs, dict):
            raise TypeError("'pdfs' must be a list and 'debs' an object")
        for pdf in pdfs:
            name, inner = str(pdf["file"]), PurePosixPath(str(pdf["path"]))
            if "/" in name or name in ("", ".", "..") or not name.isprintable():
                raise ValueError(f"file {name[:80]!r} is not a plain file name")
            if inner.is_absolute() or ".." in inner.parts:
                raise ValueError(f"path {str(inner)[:80]!r} must lie inside its package")
            if not re.fullmatch(r"[0-9a-f]{64}", str(pdf["sha256"])):
                raise ValueError(f"{name}: sha256 must be 64 hex digits")
            package = str(pdf["package"])
            deb = debs.get(package)
            if not _PACKAGE.fullmatch(package) or not isinstance(deb, dict):
                raise ValueError(f"{name}: package {package[:80]!r} is not listed in 'debs'")
            version = deb.get("version")
            if version is not None and not _VERSION.fullmatch(str(version)):
                raise ValueError(f"{package}: version {str(version)[:80]!r} is not a version")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise CorpusError(f"{manifest}: not a usable corpus manifest ({what[:200]})") from None
    return pdfs, debs


def corpus_manifest_for(questions: Path) -> Path | None:
    """``corpus.json`` beside a question file, if there is one (anything of that name: one
    that is no regular file is refused when read)."""
    candidate = questions.parent / "corpus.json"
    return candidate if candidate.is_symlink() or candidate.exists() else None


def ensure_corpus(manifest: Path, dest: Path) -> list[Path]:
    """Make every PDF of the manifest exist in ``dest`` with its recorded sha256.

    Raises:
        CorpusError: a package cannot be fetched or a PDF does not match its checksum.
    """
    wanted, debs = read_manifest(manifest)
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in wanted if not _matches(dest / p["file"], p["sha256"])]
    for package in sorted({p["package"] for p in missing}):
        deb = debs[package]
        with tempfile.TemporaryDirectory() as tmp:
            unpacked = _fetch_deb(package, deb.get("version"), Path(tmp))
            for pdf in (p for p in missing if p["package"] == package):
                shutil.copyfile(unpacked / pdf["path"], dest / pdf["file"])
    for pdf in wanted:
        if not _matches(dest / pdf["file"], pdf["sha256"]):
            raise CorpusError(f"{pdf['file']}: sha256 differs from {manifest}")
    return [dest / p["file"] for p in wanted]


def _fetch_deb(package: str, version: str | None, tmp: Path) -> Path:
    target = f"{package}={version}" if version else package
    cmd = ["apt-get", "download", target]
    done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    debs = list(tmp.glob("*.deb"))
    if done.returncode != 0 or not debs:
        raise CorpusError(f"could not download {target}: {done.stderr.strip()[-300:]}")
    out = tmp / "x"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(out)], check=True)
    return out


def _matches(path: Path, sha256: str) -> bool:
    if not path.is_file():  # a FIFO there would block the read
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == sha256
