"""The ports of storage (``kura.storage.ports``) stay narrow, and the stores satisfy them.

* Every ``Protocol`` in ``kura.storage.ports`` has at most ``MAX_MEMBERS`` members (methods and
  attributes): a port of dozens of methods is the one concrete class again.
* Each implementation has every member of its ports with a compatible signature (same
  parameter names and kinds, extra parameters optional, async where the port is async): a
  runtime check of the names, and ``test_mypy_accepts_the_implementations`` has mypy
  ``--strict`` check the typed assignments in ``_conformance`` below, structurally.
* The layers above storage name no concrete store: ``kura.api``, ``kura.grpc``, ``kura.mesh``
  and ``kura.workers`` type against the ports (the composition roots, ``kura.app`` and the
  worker process's ``kura.workers.worker``, construct them). The import-linter contract "the
  layers above storage (api, grpc, mesh, workers) type against its ports, never the concrete
  store" keeps them off ``storage.service``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Generic, Protocol

import pytest

from kura.storage import ports
from kura.storage.overlay import OverlayReader
from kura.storage.peer_queue import PeerQueues
from kura.storage.ports import (
    ArtifactReader,
    ArtifactWriter,
    ChangeLog,
    OutboxLog,
    PeerPages,
    PeerQueueView,
    Provenance,
    ReplicaApplier,
    ReplicaSink,
    ReplicaStore,
    WorkerSupport,
)
from kura.storage.reads import ArtifactReads
from kura.storage.replica_log import IndexReplicaLog
from kura.storage.service import CacheService
from kura.storage.startup_gate import StartupGatedWriter
from kura.storage.worker_reads import WorkerReads

MAX_MEMBERS = 10
ROOT = Path(__file__).resolve().parents[2]

IMPLEMENTATIONS: dict[type[Any], list[type[Any]]] = {
    ArtifactReader: [ArtifactReads, OverlayReader],
    ArtifactWriter: [CacheService, StartupGatedWriter],
    PeerPages: [CacheService],
    WorkerSupport: [CacheService],
    ReplicaSink: [CacheService],
    ReplicaApplier: [CacheService],
    ReplicaStore: [CacheService],
    OutboxLog: [IndexReplicaLog],
    ChangeLog: [IndexReplicaLog],
    PeerQueueView: [PeerQueues],
    Provenance: [CacheService],
}


def _conformance(
    store: CacheService, worker: WorkerReads, log: IndexReplicaLog, queues: PeerQueues
) -> tuple[
    ArtifactReader,
    ArtifactReader,
    ArtifactWriter,
    PeerPages,
    WorkerSupport,
    ReplicaSink,
    ReplicaStore,
    OutboxLog,
    ChangeLog,
    PeerQueueView,
    Provenance,
]:
    """Never called: mypy checks that each assignment to a port type is accepted."""
    return store.reads, worker.reads, store, store, store, store, store, log, log, queues, store


def port_classes() -> list[type[Any]]:
    return [
        obj
        for obj in vars(ports).values()
        if isinstance(obj, type)
        and obj.__module__ == ports.__name__
        and getattr(obj, "_is_protocol", False)
        and obj is not Protocol
    ]


def members(port: type[Any]) -> set[str]:
    """The public names a port declares: its methods, properties and annotated attributes,
    its base ports' included (a port's size is all it asks of an implementation)."""
    found: set[str] = set()
    for klass in port.__mro__:
        if klass.__module__ != ports.__name__:
            continue  # Protocol, Generic, object
        found |= {name for name in vars(klass) if not name.startswith("_")}
        found |= {n for n in vars(klass).get("__annotations__", {}) if not n.startswith("_")}
    return found


def instance_attributes(cls: type[Any]) -> set[str]:
    """Names a class declares for its instances (annotations along its MRO) or sets in an
    ``__init__`` (``self.name =``)."""
    found: set[str] = set()
    for klass in cls.__mro__:
        found |= set(vars(klass).get("__annotations__", {}))
        init = vars(klass).get("__init__")
        if inspect.isfunction(init):
            source = inspect.getsource(init)
            found |= {
                line.split("self.", 1)[1].split(" ", 1)[0].split(":", 1)[0]
                for line in source.splitlines()
                if line.strip().startswith("self.")
            }
    return found


def test_the_ports_are_the_ones_this_test_knows() -> None:
    found = port_classes()
    assert set(IMPLEMENTATIONS) == set(found), found  # a new port needs its implementations here


@pytest.mark.parametrize("port", port_classes(), ids=lambda p: p.__name__)
def test_each_port_is_narrow(port: type[Any]) -> None:
    names = members(port)
    assert 0 < len(names) <= MAX_MEMBERS, (port.__name__, len(names), sorted(names))


def _signature_problem(port: type[Any], impl: type[Any], name: str) -> str | None:
    want = inspect.getattr_static(port, name)
    if isinstance(want, property):
        if not hasattr(impl, name) and name not in instance_attributes(impl):
            return f"{impl.__name__} has no attribute {name}"
        return None
    have = getattr(impl, name, None)
    if have is None:
        return f"{impl.__name__} has no method {name}"
    if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
        return f"{impl.__name__}.{name}: async in one, not in the other"
    wanted = inspect.signature(want).parameters
    had = inspect.signature(have).parameters
    for pname, param in wanted.items():
        other = had.get(pname)
        if other is None or other.kind != param.kind:
            return f"{impl.__name__}.{name} lacks parameter {pname} ({param.kind.name})"
        if param.default is not inspect.Parameter.empty and other.default is param.empty:
            return f"{impl.__name__}.{name}: {pname} is optional in the port, not here"
    extra = [p for n, p in had.items() if n not in wanted and p.default is p.empty]
    if any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in extra):
        return f"{impl.__name__}.{name} requires more than the port gives: {extra}"
    return None


@pytest.mark.parametrize(
    ("port", "impl"),
    [(p, i) for p, impls in IMPLEMENTATIONS.items() for i in impls],
    ids=lambda c: c.__name__,
)
def test_each_implementation_has_every_member_of_its_port(port: type[Any], impl: type[Any]) -> None:
    problems = [_signature_problem(port, impl, name) for name in sorted(members(port))]
    assert [p for p in problems if p] == []


def test_the_worker_reader_is_not_a_writer() -> None:
    """The worker's reader shares the read path, not the store: nothing of the write path to
    disable (issue 27: it subclassed ``CacheService`` and raised on writes)."""
    for reader in (WorkerReads, ArtifactReads):
        assert not issubclass(reader, CacheService)
        for name in members(ArtifactWriter) - members(ArtifactReader):
            if name != "intact":  # the "stored and intact" check is the read path's own
                assert not hasattr(reader, name), name


def test_mypy_accepts_the_implementations() -> None:
    """``_conformance`` above, checked by mypy --strict with the project's configuration."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", __file__],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},  # this checkout's, not an install's
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("package", ["api", "grpc", "mesh", "workers"])
def test_the_layers_above_name_no_concrete_store(package: str) -> None:
    roots = {
        "workers/worker.py",  # the worker process's composition root builds its reader
    }
    found = []
    for path in sorted((ROOT / "src" / "kura" / package).rglob("*.py")):
        relative = path.relative_to(ROOT / "src" / "kura").as_posix()
        text = path.read_text()
        for concrete in re.findall(r"\b(?:CacheService|WorkerReads)\b", text):
            if relative not in roots:
                found.append(f"{relative}: {concrete}")
    assert found == []


def test_the_worker_reader_inherits_nothing() -> None:
    """It composes the read path (``storage.reads.ArtifactReads``); neither is in a chain."""
    assert WorkerReads.__mro__ == (WorkerReads, object)
    assert ArtifactReads.__mro__ == (ArtifactReads, object)


def test_no_storage_class_combines_parts_by_inheritance() -> None:
    """Issue 27: no class in ``kura.storage`` has more than one base besides ``Protocol``,
    ``Generic`` or an exception (``CacheService`` combined six mixins over shared state)."""
    found = []
    for path in sorted(Path(ports.__file__).parent.glob("*.py")):
        module = importlib.import_module(f"kura.storage.{path.stem}")
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            bases = [
                b
                for b in cls.__bases__
                if b not in (object, Protocol, Generic) and not issubclass(b, BaseException)
            ]
            name = f"{cls.__module__}.{cls.__qualname__}"
            if len(bases) > 1:
                found.append(f"{name}{tuple(b.__name__ for b in bases)}")
    assert found == []
