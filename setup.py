"""Generates kura's REAPI stubs (``kura.protos``) from ``proto/`` before setuptools builds.

pyproject.toml holds the project's metadata; this file only adds the generation step, which
runs whenever setuptools loads it (``pip install``, ``pip install -e``, a wheel or sdist build),
so a clean clone gets current stubs from ``./dev serve`` or ``./dev test`` with no extra command.

Why generate: no package on PyPI ships REAPI stubs with the compressor fields (REAPI 2.1+) and
SplitBlob/SpliceBlob for Python 3.11 (buildgrid-common 0.5.2 predates them; its later releases
need Python 3.12). The definitions in ``proto/`` are upstream's, unmodified (proto/README.md names
the commits). The output is never edited by hand: ``grpc_tools.protoc`` writes the messages
(``_pb2.py``), the gRPC services (``_pb2_grpc.py``) and, through mypy-protobuf's plugins, their
typed ``.pyi``; then one mechanical step moves the generated packages under ``kura.protos`` by
rewriting their import lines (protoc's Python generator has no package-prefix option, and a
top-level ``build`` package would shadow PyPI's ``build``).

Run it by hand with ``python setup.py --name`` (any setup.py command loads this file).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PROTO = ROOT / "proto"
OUT = ROOT / "src" / "kura" / "protos"
# The generated packages that move under kura.protos (the google.api and google.rpc ones come
# from googleapis-common-protos and stay where they are). google.longrunning is generated too,
# from googleapis-common-protos' own .proto: its Python module imports grpc (it tries the gRPC
# variant first), and a worker process, which reads REAPI messages but serves no gRPC, must not
# load grpc (tests/integration/test_workers.py).
OURS = ("build", "google.bytestream", "google.longrunning")
LONGRUNNING = "google/longrunning/operations.proto"
STAMP = OUT / ".generated-from"


def sources() -> list[Path]:
    return sorted(PROTO.rglob("*.proto"))


def fingerprint() -> str:
    """The proto files' names and SHA-256 digests, and this file's: regenerate when one changed."""
    files = [*sources(), Path(__file__).resolve(), longrunning_source()]
    return "\n".join(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in files)


def rewrite(text: str) -> str:
    """Moves imports of the packages in OURS under ``kura.protos`` (import lines only: the
    serialized descriptors inside the modules keep the upstream file and package names, which
    are what the wire and the descriptor pool use)."""
    ours = "|".join(re.escape(p) for p in OURS)
    text = re.sub(rf"^from ({ours})(\.| )", r"from kura.protos.\1\2", text, flags=re.M)

    # `import build.bazel.x.y_pb2` (the .pyi files): import the moved module, and bind the
    # top-level name the annotations spell (`build.bazel.x.y_pb2.Message`) to the moved package.
    def moved(match: re.Match[str]) -> str:
        module = match.group(1)
        top = module.split(".")[0]
        return f"import kura.protos.{module}\nfrom kura.protos import {top} as {top}"

    return re.sub(rf"^import ((?:{ours})\.[\w.]+)$", moved, text, flags=re.M)


def plugin(name: str) -> str:
    """A protoc plugin installed beside this interpreter (a build environment's or a venv's)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"setup.py: {name} not found (install mypy-protobuf)")
    return found


def googleapis_root() -> Path:
    """Where googleapis-common-protos' google/api, google/rpc and google/longrunning .proto
    files are (beside its modules)."""
    import google.api

    return Path(next(iter(google.api.__path__))).parent.parent


def longrunning_source() -> Path:
    """googleapis-common-protos ships google/longrunning/operations.proto as
    operations_proto.proto (its Python module still registers the upstream file name)."""
    return googleapis_root() / "google" / "longrunning" / "operations_proto.proto"


def generate() -> None:
    if not PROTO.is_dir():  # an sdist unpacked without proto/ already has the stubs
        return
    if STAMP.exists() and STAMP.read_text() == fingerprint():
        return
    from grpc_tools import protoc

    googleapis = googleapis_root()
    tools = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        longrunning = Path(tmp, "include", "google", "longrunning")
        longrunning.mkdir(parents=True)
        shutil.copy(longrunning_source(), longrunning / "operations.proto")
        generated = Path(tmp, "out")
        generated.mkdir()
        args = [
            "grpc_tools.protoc",
            f"--proto_path={PROTO}",
            f"--proto_path={Path(tmp, 'include')}",
            f"--proto_path={googleapis}",
            f"--proto_path={tools}",
            f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={generated}",
            f"--grpc_python_out={generated}",
            f"--mypy_out={generated}",
            f"--mypy_grpc_out={generated}",
            *(str(p.relative_to(PROTO)) for p in sources()),
            LONGRUNNING,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("setup.py: protoc failed on proto/ (see above)")
        if OUT.exists():
            shutil.rmtree(OUT)
        for path in sorted(generated.rglob("*")):
            target = OUT / path.relative_to(generated)
            if path.is_dir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rewrite(path.read_text()))
        for directory in [OUT, *(p for p in OUT.rglob("*") if p.is_dir())]:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text("")
        (OUT / "__init__.py").write_text(
            '"""REAPI stubs generated from proto/ by setup.py at install time: never edit."""\n'
        )
        (OUT / "py.typed").write_text("")
    STAMP.write_text(fingerprint())


generate()
setup()
