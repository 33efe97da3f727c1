"""Fetch the PDFs a ``corpus.json`` names from their Debian packages and check their sha256."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path


class CorpusError(RuntimeError):
    pass


def corpus_manifest_for(questions: Path) -> Path | None:
    """``corpus.json`` beside a question file, if there is one."""
    candidate = questions.parent / "corpus.json"
    return candidate if candidate.exists() else None


def ensure_corpus(manifest: Path, dest: Path) -> list[Path]:
    """Make every PDF of the manifest exist in ``dest`` with its recorded sha256.

    Raises:
        CorpusError: a package cannot be fetched or a PDF does not match its checksum.
    """
    spec = json.loads(manifest.read_text())
    dest.mkdir(parents=True, exist_ok=True)
    wanted = spec["pdfs"]
    missing = [p for p in wanted if not _matches(dest / p["file"], p["sha256"])]
    for package in sorted({p["package"] for p in missing}):
        deb = spec["debs"][package]
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
    if not path.exists():
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == sha256
