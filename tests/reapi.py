"""Build REAPI v2 messages the way Bazel does, for tests of the Bazel HTTP cache.

Uses the same generated stubs as the node (``kura.protos``, generated from proto/ at install); the bytes are real protobuf
encodings, not hand-made fixtures.
"""

from __future__ import annotations

import hashlib

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)


def digest(data: bytes) -> reapi.Digest:
    return reapi.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def action_result(
    files: dict[str, bytes] | None = None,
    *,
    stdout: bytes | None = None,
    trees: dict[str, bytes] | None = None,
    exit_code: int = 0,
) -> bytes:
    """A serialized ActionResult with ``files`` as output files (path -> content), optional
    stdout by digest, and ``trees`` as output directories (path -> serialized Tree)."""
    result = reapi.ActionResult(exit_code=exit_code)
    for path, content in (files or {}).items():
        result.output_files.add(path=path, digest=digest(content))
    if stdout is not None:
        result.stdout_digest.CopyFrom(digest(stdout))
    for path, tree in (trees or {}).items():
        result.output_directories.add(path=path, tree_digest=digest(tree))
    result.execution_metadata.worker = "test"  # Bazel always records one; never zero bytes
    return result.SerializeToString()


def tree(root_files: dict[str, bytes], child_files: dict[str, bytes]) -> bytes:
    """A serialized Tree: ``root_files`` in the root, ``child_files`` in one child directory."""
    child = reapi.Directory()
    for name, content in child_files.items():
        child.files.add(name=name, digest=digest(content))
    child_bytes = child.SerializeToString()
    root = reapi.Directory()
    for name, content in root_files.items():
        root.files.add(name=name, digest=digest(content))
    root.directories.add(name="sub", digest=digest(child_bytes))
    return reapi.Tree(root=root, children=[child]).SerializeToString()
