"""The Kubernetes API server, through the official ``kubernetes`` client: the only kured module
that imports it.

``ApiServer`` offers the few calls kured makes (its DaemonSet or Lease, its Node, pods on the node,
evictions) as coroutines. The client is synchronous, so every call runs in this instance's own
bounded thread pool (``max_workers`` threads), carries the client's ``_request_timeout`` and is
awaited under ``asyncio.timeout`` slightly longer, so no call can hang the agent. A call whose
awaiting task is cancelled still finishes in its thread, bounded by the same request timeout.

Objects travel as plain JSON (``dict``), not as the client's generated models, on purpose:

* the lock is a read-modify-PUT of the whole DaemonSet. The generated models drop every field
  they do not know while deserialising, so a PUT built from them would erase fields a newer API
  server added (and ``kubernetes`` 37's models refuse unknown fields in request bodies). The PUT
  therefore goes through the client's generic ``param_serialize``/``call_api`` with the object
  exactly as read, only the annotation changed;
* reads use the typed methods with ``_preload_content=False`` and decode the JSON themselves,
  for the same reason and so that a field the models mistype cannot fail a read.

Errors are translated here, once: ``ApiException`` (any non-2xx answer) becomes ``ApiError``
with the HTTP status and the ``Status.reason`` of the body; a connection failure, a timeout or
a malformed answer becomes ``ApiError`` with status 0. Responses are read up to
``MAX_RESPONSE_BYTES``; a larger one is an error, not an unbounded read.

The ``kubernetes`` package is an install extra (``kura-cache[kubernetes]``): this module imports it
only when an ``ApiServer`` is made, so the etcd and FleetLock paths never load it, and
``require_client`` turns its absence into a ``ConfigurationError`` that names the extra.

Instances are safe to share between tasks of one event loop; ``close()`` stops the pool and the
client's connection pool (the instance must not be used afterwards).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kured.core.errors import ApiError, ConfigurationError

if TYPE_CHECKING:  # imported when used: the client is the optional extra ``kura-cache[kubernetes]``
    import kubernetes.client as k8s
    from kubernetes.client.exceptions import ApiException

# The distribution (kura-cache) is not on PyPI: the extra installs from a checkout.
KUBERNETES_EXTRA = "`pip install '.[kubernetes]'` in the kura checkout"

DEFAULT_REQUEST_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_WORKERS = 4
# A Node or DaemonSet is a few tens of KiB; a page of pods is bounded by ``limit``.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# asyncio's bound is the client's own plus this, so the client's timeout normally fires first
# and reports itself.
_ASYNC_GRACE_SECONDS = 2.0

JsonObject = dict[str, Any]
T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def require_client() -> None:
    """Import the ``kubernetes`` package. Raises ``ConfigurationError`` naming
    ``KUBERNETES_EXTRA`` when it is not installed (or does not import)."""
    try:
        import kubernetes.client
        import kubernetes.config  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            [
                "the Kubernetes backends (--lock-backend=kubernetes or lease, kured status "
                "--all, doctor's cluster checks) need the Kubernetes client, which is not "
                f"installed ({exc}): {KUBERNETES_EXTRA}"
            ]
        ) from exc


def load_configuration(kubeconfig: str | Path | None) -> k8s.Configuration:
    """A client configuration from the kubeconfig file at ``kubeconfig``, or from the pod's
    service account when it is None or empty (in-cluster, as kured always does).

    Raises ``ConfigurationError`` when neither can be loaded, or when the ``kubernetes``
    package is not installed (``require_client``). The process-wide default configuration of
    the ``kubernetes`` package is left untouched.
    """
    require_client()
    import kubernetes.client as k8s
    import kubernetes.config

    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            # The loaders carry no annotations (the generated client does).
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except Exception as exc:
        # A boundary: the loaders raise ConfigException, OSError, YAML errors, KeyError...
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise ConfigurationError(
            [f"cannot load Kubernetes credentials from {where}: {exc}"]
        ) from exc
    return configuration


def _status_of(body: bytes | str | None) -> tuple[str, str]:
    """(reason, message) of a ``Status`` body, or ("", snippet) for anything else."""
    if body is None:
        return "", ""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        decoded = json.loads(text)
    except ValueError:
        return "", text[:200]
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        message = str(decoded.get("message") or "")
        # A refused eviction names its PodDisruptionBudget only in the causes.
        causes = (decoded.get("details") or {}).get("causes") or []
        extra = [str(c.get("message")) for c in causes if isinstance(c, dict) and c.get("message")]
        if extra:
            message += " (" + "; ".join(extra) + ")"
        return str(decoded.get("reason") or ""), message[:500]
    return "", text[:200]


def _api_error(what: str, exc: ApiException) -> ApiError:
    status = int(exc.status or 0)
    reason, message = _status_of(exc.body)
    reason = reason or str(exc.reason or "")
    detail = message or reason or "no detail"
    return ApiError(f"{what}: HTTP {status} {reason}: {detail}", status=status, reason=reason)


def _decode(data: bytes, what: str) -> JsonObject:
    if len(data) > MAX_RESPONSE_BYTES:
        raise ApiError(f"{what}: answer over {MAX_RESPONSE_BYTES} bytes")
    try:
        decoded = json.loads(data) if data else {}
    except ValueError as exc:
        raise ApiError(f"{what}: answer is not JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise ApiError(f"{what}: answer is not a JSON object")
    return decoded


def _read(response: Any) -> bytes:
    """The body of a urllib3 (or the client's REST) response, at most one byte over the
    limit so an oversized answer is recognised without being read whole."""
    data = response.read(MAX_RESPONSE_BYTES + 1)
    return bytes(data or b"")


class ApiServer:
    """kured's calls to the Kubernetes API server (see the module docstring).

    ``request_timeout_seconds`` bounds each HTTP exchange; ``max_workers`` the threads (and so
    the concurrent requests) of this instance.
    """

    def __init__(
        self,
        configuration: k8s.Configuration,
        *,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        if request_timeout_seconds <= 0:
            raise ValueError("request_timeout_seconds must be positive")
        import kubernetes.client as k8s

        self._client = k8s.ApiClient(configuration)
        self._core = k8s.CoreV1Api(self._client)
        self._apps = k8s.AppsV1Api(self._client)
        self._coordination = k8s.CoordinationV1Api(self._client)
        self._policy = k8s.PolicyV1Api(self._client)
        self._timeout_seconds = request_timeout_seconds
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="kured-apiserver")
        self._closed = False

    @classmethod
    def connect(
        cls,
        kubeconfig: str | Path | None,
        *,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> ApiServer:
        """An ``ApiServer`` for ``load_configuration(kubeconfig)``. Makes no request yet.
        Raises ``ConfigurationError``."""
        return cls(
            load_configuration(kubeconfig),
            request_timeout_seconds=request_timeout_seconds,
            max_workers=max_workers,
        )

    @property
    def request_timeout_seconds(self) -> float:
        return self._timeout_seconds

    async def close(self) -> None:
        """Stop the thread pool (waiting for calls in flight) and close the connections.
        Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        self._client.close()  # type: ignore[no-untyped-call]

    # -- DaemonSets ------------------------------------------------------------------------------

    async def get_daemonset(self, namespace: str, name: str) -> JsonObject:
        """The DaemonSet as JSON. Raises ``ApiError`` (404 when absent)."""
        what = f"GET daemonset {namespace}/{name}"
        return await self._typed(
            what,
            partial(self._apps.read_namespaced_daemon_set, name, namespace),
        )

    async def replace_daemonset(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> JsonObject:
        """PUT ``obj`` (the whole object, ``metadata.resourceVersion`` as read) and return the
        stored object. Raises ``ApiError``; status 409 when the object changed since it was read
        (the caller re-reads and retries)."""
        what = f"PUT daemonset {namespace}/{name}"
        return await self._raw(
            what,
            "PUT",
            "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}",
            {"namespace": namespace, "name": name},
            dict(obj),
        )

    # -- Leases (coordination.k8s.io/v1) --------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> JsonObject:
        """The Lease as JSON. Raises ``ApiError`` (404 when absent)."""
        return await self._typed(
            f"GET lease {namespace}/{name}",
            partial(self._coordination.read_namespaced_lease, name, namespace),
        )

    async def create_lease(self, namespace: str, obj: Mapping[str, Any]) -> JsonObject:
        """POST a new Lease and return it. Raises ``ApiError``; 409 (``AlreadyExists``) when
        another client created it first."""
        return await self._raw(
            f"POST lease {namespace}",
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            {"namespace": namespace},
            dict(obj),
        )

    async def replace_lease(self, namespace: str, name: str, obj: Mapping[str, Any]) -> JsonObject:
        """PUT the whole Lease (``metadata.resourceVersion`` as read). Raises ``ApiError``;
        409 when it changed since it was read."""
        return await self._raw(
            f"PUT lease {namespace}/{name}",
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
            {"namespace": namespace, "name": name},
            dict(obj),
        )

    # -- Nodes -----------------------------------------------------------------------------------

    async def get_node(self, name: str) -> JsonObject:
        """The Node as JSON. Raises ``ApiError`` (404 when absent)."""
        return await self._typed(f"GET node {name}", partial(self._core.read_node, name))

    async def list_nodes(self) -> list[JsonObject]:
        """Every Node as JSON (for ``kured status --all``)."""
        data = await self._typed("LIST nodes", self._core.list_node)
        items = data.get("items") or []
        return [dict(item) for item in items if isinstance(item, dict)]

    async def patch_node(
        self,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        content_type: str = STRATEGIC_MERGE_PATCH,
    ) -> JsonObject:
        """PATCH the Node (``content_type``: strategic merge by default, JSON merge, or a JSON
        patch list) and return it. Raises ``ApiError`` (422 for an invalid patch)."""
        body: Any = [dict(op) for op in patch] if isinstance(patch, Sequence) else dict(patch)
        return await self._typed(
            f"PATCH node {name}",
            partial(self._core.patch_node, name, body, _content_type=content_type),
        )

    # -- Pods ------------------------------------------------------------------------------------

    async def list_pods(
        self,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 500,
        max_items: int | None = None,
    ) -> list[JsonObject]:
        """Pods in every namespace matching both selectors, following ``continue`` tokens in
        pages of ``limit`` and stopping once ``max_items`` are collected (None: all). Order is
        the server's. Raises ``ApiError``."""
        items: list[JsonObject] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": limit}
            if label_selector:
                kwargs["label_selector"] = label_selector
            if field_selector:
                kwargs["field_selector"] = field_selector
            if token:
                kwargs["_continue"] = token
            page = await self._typed(
                f"LIST pods ({label_selector or 'all'}; {field_selector or 'all'})",
                partial(self._core.list_pod_for_all_namespaces, **kwargs),
            )
            batch = page.get("items") or []
            if not isinstance(batch, list):
                raise ApiError("LIST pods: items is not a list")
            items.extend(item for item in batch if isinstance(item, dict))
            if max_items is not None and len(items) >= max_items:
                return items[:max_items]
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        """The Pod as JSON. Raises ``ApiError`` (404 when it is gone)."""
        return await self._typed(
            f"GET pod {namespace}/{name}",
            partial(self._core.read_namespaced_pod, name, namespace),
        )

    async def evict_pod(
        self, namespace: str, name: str, grace_period_seconds: int | None = None
    ) -> None:
        """POST a policy/v1 Eviction for the pod; ``grace_period_seconds`` None leaves the
        pod's own termination grace period. Raises ``ApiError``: 429 when a
        PodDisruptionBudget refuses it now, 404 when the pod is already gone."""
        import kubernetes.client as k8s

        options = (
            k8s.V1DeleteOptions(grace_period_seconds=grace_period_seconds)
            if grace_period_seconds is not None
            else None
        )
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=options,
        )
        await self._typed(
            f"evict pod {namespace}/{name}",
            partial(self._core.create_namespaced_pod_eviction, name, namespace, body),
        )

    # -- PodDisruptionBudgets ---------------------------------------------------------------------

    async def list_pod_disruption_budgets(self) -> list[JsonObject]:
        """Every policy/v1 PodDisruptionBudget in every namespace as JSON, with the
        ``status`` the disruption controller keeps (``disruptionsAllowed``, ``currentHealthy``,
        ``desiredHealthy``, ``expectedPods``). Order is the server's. Raises ``ApiError``."""
        data = await self._typed(
            "LIST poddisruptionbudgets",
            self._policy.list_pod_disruption_budget_for_all_namespaces,
        )
        items = data.get("items") or []
        return [dict(item) for item in items if isinstance(item, dict)]

    # -- plumbing --------------------------------------------------------------------------------

    async def _run(self, what: str, call: Callable[[], T]) -> T:
        import urllib3
        from kubernetes.client.exceptions import ApiException, OpenApiException

        if self._closed:
            raise ApiError(f"{what}: the API client is closed")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_seconds + _ASYNC_GRACE_SECONDS):
                return await loop.run_in_executor(self._pool, call)
        except TimeoutError as exc:
            raise ApiError(f"{what}: no answer within {self._timeout_seconds:g}s") from exc
        except ApiException as exc:
            raise _api_error(what, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}") from exc
        except (OpenApiException, ValueError) as exc:  # the client refused our arguments
            raise ApiError(f"{what}: the client refused the request: {exc}") from exc

    async def _typed(self, what: str, method: Callable[..., Any]) -> JsonObject:
        timeout = self._timeout_seconds

        def call() -> bytes:
            response = method(_preload_content=False, _request_timeout=timeout)
            try:
                return _read(response)
            finally:
                response.release_conn()

        return _decode(await self._run(what, call), what)

    async def _raw(
        self,
        what: str,
        method: str,
        path: str,
        path_params: dict[str, str],
        body: JsonObject,
    ) -> JsonObject:
        from kubernetes.client.exceptions import ApiException

        client, timeout = self._client, self._timeout_seconds

        def call() -> bytes:
            request = client.param_serialize(
                method=method,
                resource_path=path,
                path_params=path_params,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = client.call_api(*request, _request_timeout=timeout)
            try:
                data = _read(response.response)
            finally:
                response.response.release_conn()
            if not 200 <= response.status <= 299:
                text = data.decode("utf-8", errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=text)
            return data

        return _decode(await self._run(what, call), what)
