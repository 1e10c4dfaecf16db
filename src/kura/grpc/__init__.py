"""The REAPI v2 cache services over gRPC: Capabilities, ContentAddressableStorage, ActionCache
and ByteStream (https://github.com/bazelbuild/remote-apis, ``remote_execution.proto``;
https://github.com/googleapis/googleapis ``google/bytestream/bytestream.proto``).

One module per service; ``kura.grpc.server`` starts them on ``KURA_GRPC_PORT`` with grpcio's
asyncio server in the node's event loop, beside aiohttp. They use the same store, keys, tmp
budget and tokens as the Bazel HTTP cache (``kura.api.bazel_http``), so replication, bootstrap
and eviction treat a blob written over gRPC like any other artifact.
"""
