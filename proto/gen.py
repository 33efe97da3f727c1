"""Generate (or check) the Python code for ``proto/ragline/v1/*.proto``.

The generated modules are committed under ``ragline/v1/`` so a plain install needs no protoc.
``python proto/gen.py`` rewrites them; ``python proto/gen.py --check`` regenerates into a
temporary folder and fails (exit 1) when the committed code is stale. The test command runs
the check, so CI fails on stale code.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = Path("ragline") / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency: only needed to (re)generate

    protos = sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / PACKAGE).iterdir() if p.name.endswith(SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        target = ROOT / PACKAGE
        if args.check:
            committed = {p.name for p in target.iterdir() if p.name.endswith(SUFFIXES)}
            stale = [
                p.name
                for p in fresh
                if not (target / p.name).exists()
                or not filecmp.cmp(p, target / p.name, shallow=False)
            ]
            extra = committed - {p.name for p in fresh}
            if stale or extra:
                print(
                    f"generated protobuf code is stale: {sorted(stale + list(extra))}; "
                    "run `python proto/gen.py` and commit",
                    file=sys.stderr,
                )
                return 1
            print(f"generated protobuf code is up to date ({len(fresh)} files)")
            return 0
        target.mkdir(parents=True, exist_ok=True)
        for p in target.iterdir():
            if p.name.endswith(SUFFIXES):
                p.unlink()
        for p in fresh:
            shutil.copy2(p, target / p.name)
        print(f"wrote {len(fresh)} files to {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
