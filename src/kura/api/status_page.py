"""The status page: ``GET /ui``, server-rendered HTML of ``GET /status``; ``GET /`` redirects.

No other route claims ``GET /`` or ``GET /ui``: the cache prefixes cannot be ``/``
(``settings._prefix``) and their routes need a key after the prefix.

The page is drawn from the very dict ``/status`` returns (``Node.status``, through
``probes.STATUS_KEY``), so the two cannot disagree. It needs no JavaScript and reloads itself
every ``REFRESH_SECONDS`` (``<meta http-equiv="refresh">``). Every value is escaped with
``html.escape``; a Content-Security-Policy allows no script, no fetch and no outside resource.

Access: exactly the rule of ``/status`` (a read token when tokens or JWT are configured). A
browser cannot attach ``Authorization: Bearer`` to a plain navigation, so the 401 carries two
challenges: ``Bearer`` (for API clients, like every other route) and ``Basic``, which makes a
browser ask for a user name and password; the token goes in the password field (the user name
is ignored), and ``TokenAuth`` already accepts a token as a Basic password. A ``?token=`` query
parameter is deliberately NOT accepted: a token in a page URL ends up in the access log
(``KURA_ACCESS_LOG``), browser history and Referer headers, which RFC 6750 §5.3 ("Don't pass
bearer tokens in page URLs") warns against.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from string import Template
from typing import Any

from aiohttp import web

from kura.api.auth import Access
from kura.api.grant_scope import request_namespace
from kura.api.http import ctx, endpoint
from kura.api.probes import PROTOCOL, STATUS_KEY
from kura.console import bootstrap_fraction, human_bytes, peer_version
from kura.core.errors import Forbidden, Unauthenticated
from kura.core.namespace_rule import SHED_AGE_BUCKETS

PATH = "/ui"
REFRESH_SECONDS = 5
HEADERS = {
    "Cache-Control": "no-store",
    # No script, no request from the page but its own stylesheet block and the empty icon.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
CHALLENGES = ('Bearer realm="kura"', 'Basic realm="kura status", charset="UTF-8"')

PAGE = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="$refresh">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>kura $region: $state_word</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:80em}
h1{font-size:1.4em;margin:0}h2{font-size:1.1em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
.muted{color:#666}.state{display:inline-block;padding:.2em .7em;border-radius:1em;font-weight:600}
.ready{background:#d7f5dd;color:#14532d}.not-ready{background:#fde2e1;color:#7f1d1d}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.25em .6em;
border-bottom:1px solid #eee;vertical-align:top}th{background:#f6f6f6}td.n{text-align:right}
progress{width:20em;height:1em;vertical-align:middle}code{font-size:.95em}
.warn{color:#92400e}.error{color:#991b1b}
</style>
</head>
<body>
<header>
<h1>kura <span class="muted" id="version">$version</span>
<span class="muted" id="wire-version">wire $wire_version</span></h1>
<p id="identity">node <code>$node_url</code> &middot; public <code>$public_url</code>
&middot; tenant <code>$tenant_id</code> &middot; region <code>$region</code>
&middot; membership generation $generation</p>
<p><span id="readiness" class="state $state_class" data-ready="$ready">$state_word</span></p>
</header>
<section id="reasons"><h2>Readiness</h2>$reasons</section>
<section id="bootstrap"><h2>Bootstrap</h2>$bootstrap</section>
<section id="peers"><h2>Peers</h2>$peers</section>
<section id="cache"><h2>Hit ratio per protocol</h2>$lookups</section>
<section id="storage"><h2>Disk and tmp budget</h2>$storage</section>
<section id="namespaces"><h2>Namespaces and retention</h2>$namespaces</section>
<section id="errors"><h2>Recent warnings and errors</h2>$errors</section>
<footer><p class="muted">Rendered $rendered_at; reloads every $refresh s.
The same data as JSON: <a href="/status">/status</a>.</p></footer>
</body>
</html>
""")


def render(status: dict[str, Any], rendered_at: datetime | None = None) -> str:
    """The page for one ``/status`` dict (its shape: ``Node.status``). Pure: no IO."""
    ready = bool(status["ready"])
    word = "ready" if ready else "not ready"
    return PAGE.substitute(
        refresh=REFRESH_SECONDS,
        version=_e(status.get("version", "")),
        wire_version=_e(status.get("wire_version") or 1),
        node_url=_e(status["node_url"]),
        public_url=_e(status["public_url"]),
        tenant_id=_e(status["tenant_id"]),
        region=_e(status["region"]),
        generation=_e(status["generation"]),
        ready="true" if ready else "false",
        state_class="ready" if ready else "not-ready",
        state_word=word,
        reasons=_reasons(status),
        bootstrap=_bootstrap(status.get("bootstrap") or {}),
        peers=_peers(status["peers"]),
        lookups=_lookups(status.get("lookups", {})),
        storage=_storage(status),
        namespaces=_namespaces(status),
        errors=_errors(status.get("recent_errors", [])),
        rendered_at=_e((rendered_at or datetime.now(UTC)).isoformat(timespec="seconds")),
    )


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _list(items: list[str], css: str, empty: str) -> str:
    if not items:
        return f'<p class="muted">{_e(empty)}</p>'
    return f'<ul class="{css}">' + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int], empty: str) -> str:
    """A table of already escaped cells; columns in ``numeric`` are right-aligned."""
    if not rows:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _meter(done: float, total: float, label: str) -> str:
    fraction = 1.0 if total <= 0 else max(0.0, min(1.0, done / total))
    return (
        f'<p><progress max="1" value="{fraction:.4f}">{fraction * 100:.0f}%</progress> '
        f"{fraction * 100:.0f}% &middot; {_e(label)}</p>"
    )


def _reasons(status: dict[str, Any]) -> str:
    reasons = _list(list(status["reasons"]), "error", "No reason keeps this node from serving.")
    warnings = _list(list(status["warnings"]), "warn", "No warnings.")
    return f"<h3>Reasons</h3>{reasons}<h3>Warnings</h3>{warnings}"


def _bootstrap(b: dict[str, Any]) -> str:
    if not b:
        return '<p class="muted">No bootstrap state.</p>'
    fraction = bootstrap_fraction(b)
    out = _meter(
        fraction,
        1.0,
        f"{b.get('peers_done', 0)} of {b.get('peers_total', 0)} peers done, "
        f"{human_bytes(b.get('bytes_done', 0))} of {human_bytes(b.get('bytes_total', 0))}, "
        f"{b.get('artifacts_done', 0)} of {b.get('artifacts_total', 0)} artifacts",
    )
    out = out.replace("<p>", f'<p id="bootstrap-progress" data-fraction="{fraction:.4f}">', 1)
    if b.get("budget_stopped"):
        out += (
            '<p class="warn" id="bootstrap-budget">'
            + _e(
                f"Stopped at the disk budget ({human_bytes(b.get('budget_limit_bytes', 0))}): "
                f"holding {b.get('held_percent', 0)}% of the peers' data "
                f"({b.get('held_artifacts', 0)} of {b.get('peer_data_artifacts', 0)} artifacts, "
                f"{human_bytes(b.get('held_bytes', 0))} of "
                f"{human_bytes(b.get('peer_data_bytes', 0))})."
            )
            + "</p>"
        )
    rows = [
        [
            f"<code>{_e(p['peer'])}</code>",
            _e(p["phase"] + (" (abandoned)" if p.get("abandoned") else "")),
            _e(f"{human_bytes(p['bytes_done'])} / {human_bytes(p['bytes_total'])}"),
            _e(f"{p['artifacts_done']} / {p['artifacts_total']}"),
            _e(p["passes"]),
            _e(p.get("mode") or ""),
            _e(p.get("last_error") or ""),
        ]
        for p in b.get("peers", [])
    ]
    headers = ["peer", "phase", "bytes", "artifacts", "passes", "mode", "last error"]
    return out + _table(headers, rows, {2, 3, 4}, "No peer to bootstrap from.")


def _peers(peers: list[dict[str, Any]]) -> str:
    rows = []
    for p in peers:
        state = "healthy" if p["healthy"] else ("down" if p["known"] else "unprobed")
        catch_up = ""
        if p.get("needs_catch_up"):
            catch_up = "needs catch-up" + (" (catching up)" if p.get("catching_up") else "")
        rows.append(
            [
                f"<code>{_e(p['node_url'])}</code>",
                _e(p.get("region", "")),
                _e(state),
                _e(peer_version(p)),
                _e(p["outbox_messages"]),
                _e(f"{p['outbox_oldest_age_seconds']:.1f} s"),
                _e(p.get("replication_failures_in_a_row", 0)),
                _e(" · ".join(x for x in (catch_up, p.get("last_error") or "") if x)),
            ]
        )
    headers = ["peer", "region", "state", "version", "outbox", "oldest (lag)", "failures", "notes"]
    return _table(headers, rows, {4, 5, 6}, "No peers.")


def _lookups(lookups: dict[str, dict[str, int]]) -> str:
    rows = []
    for protocol, counts in lookups.items():
        hits, misses = counts.get("hit", 0), counts.get("miss", 0)
        total = hits + misses
        ratio = f"{hits / total * 100:.1f}%" if total else "-"
        rows.append([_e(protocol), _e(hits), _e(misses), _e(ratio)])
    return _table(["protocol", "hits", "misses", "hit ratio"], rows, {1, 2, 3}, "No reads yet.")


def _storage(status: dict[str, Any]) -> str:
    used, limit = status["disk_used_bytes"], status.get("disk_limit_bytes", 0)
    reserved, capacity = status["tmp_reserved_bytes"], status["tmp_capacity_bytes"]
    return (
        '<h3>Disk</h3><div id="disk">'
        + _meter(
            used,
            limit,
            f"{human_bytes(used)} of {human_bytes(limit)} in {status['artifacts']} artifacts",
        )
        + '</div><h3>Tmp staging budget</h3><div id="tmp">'
        + _meter(reserved, capacity, f"{human_bytes(reserved)} of {human_bytes(capacity)} reserved")
        + f"</div><p>Outbox: {_e(status['outbox_messages'])} messages waiting, all peers.</p>"
    )


def _age(seconds: float | None) -> str:
    """``30d``, ``12h``, ``15m``, ``45s``; ``-`` for None (the global setting, or nothing)."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _shed_age(rule: dict[str, Any]) -> str:
    """A rule's median shed age: ``-`` when nothing was shed (expiry is not counted), ``> 90d``
    when the median is past the histogram's last bound (``null`` in ``/status``)."""
    median = rule["shed_age_median_seconds"]
    if median is not None:
        return _age(median)
    shed = sum(rule["evictions"].get(reason, 0) for reason in ("quota", "lru", "forced"))
    return f"> {_age(SHED_AGE_BUCKETS[-1])}" if shed else "-"


def _namespaces(status: dict[str, Any]) -> str:
    """Usage per namespace (as last measured) and each retention rule with its evictions by
    reason and median shed age (``node_status._namespace_rules``)."""
    usage = [
        [
            f"<code>{_e(n['namespace'])}</code>",
            _e(n["rule"]),
            _e(human_bytes(n["used_bytes"])),
            _e(n["artifacts"]),
        ]
        for n in status.get("namespaces", [])
    ]
    rules = []
    for r in status.get("namespace_rules", []):
        ev = r["evictions"]
        quota = r["quota_bytes"]
        forced = ev.get("forced", 0)
        rules.append(
            [
                f"<code>{_e(r['rule'])}</code>",
                _e(_age(r["max_age_seconds"])),
                _e("-" if quota is None else human_bytes(quota)),
                _e(_age(r["min_age_seconds"] or None)),
                _e(ev.get("max_age", 0)),
                _e(ev.get("quota", 0)),
                _e(ev.get("lru", 0)),
                f'<span class="warn">{_e(forced)}</span>' if forced else "0",
                _e(_shed_age(r)),
            ]
        )
    headers = ["rule", "max age", "quota", "min age", "expired", "over quota", "LRU", "forced"]
    return (
        '<h3>Usage, as last measured</h3><div id="namespace-usage">'
        + _table(
            ["namespace", "rule", "bytes", "artifacts"],
            usage,
            {2, 3},
            "Not measured yet (every expiry pass measures it while KURA_NAMESPACE_RULES is set).",
        )
        + '</div><h3>Rules (KURA_NAMESPACE_RULES)</h3><div id="namespace-rules">'
        + _table([*headers, "median shed age"], rules, {4, 5, 6, 7, 8}, "No rules.")
        + "</div>"
    )


def _errors(records: list[dict[str, str]]) -> str:
    rows = [
        [
            _e(r["at"]),
            f'<span class="{"error" if r["level"] in ("ERROR", "CRITICAL") else "warn"}">'
            f"{_e(r['level'])}</span>",
            _e(r["logger"]),
            _e(r["message"]),
        ]
        for r in records
    ]
    return _table(["at", "level", "logger", "message"], rows, set(), "None since start.")


@endpoint(PROTOCOL, None)
async def page(request: web.Request) -> web.StreamResponse:
    """The status page (``text/html``); 401 with Bearer and Basic challenges without a valid
    read token when access control is on, 403 for a JWT grant without read."""
    try:
        ctx(request).auth.check(
            request.headers.get("Authorization"),
            Access.READ,
            lambda: request_namespace(request, PROTOCOL),
        )
    except (Unauthenticated, Forbidden) as exc:
        return _refusal(exc)
    return web.Response(
        text=render(await request.app[STATUS_KEY]()), content_type="text/html", headers=HEADERS
    )


def _refusal(exc: Unauthenticated | Forbidden) -> web.Response:
    status = 401 if isinstance(exc, Unauthenticated) else 403
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" '
        f'href="data:,"><title>kura: {status}</title></head><body><h1>{status}</h1>'
        f"<p>{_e(exc.message)}</p><p>This page needs a read token: enter it as the password "
        "(any user name), or send <code>Authorization: Bearer &lt;token&gt;</code>.</p>"
        "</body></html>"
    )
    response = web.Response(status=status, text=body, content_type="text/html", headers=HEADERS)
    if status == 401:
        for challenge in CHALLENGES:
            response.headers.add("WWW-Authenticate", challenge)
    return response


@endpoint(PROTOCOL, None)
async def root(request: web.Request) -> web.StreamResponse:
    """``/`` has no other route: send a browser to the status page (302, no auth needed)."""
    return web.Response(status=302, headers={"Location": PATH})


def routes() -> list[web.RouteDef]:
    return [web.get(PATH, page), web.get("/", root)]
