"""Notification URLs and message templates: kured's (shoutrrr) spellings read into apprise's.

kured sends its notifications with shoutrrr (https://containrrr.dev/shoutrrr/); we deliver with
apprise (https://appriseit.com/), whose service URLs differ for several services. ``translate``
turns one ``--notify-url`` into the apprise URL that reaches the same place, or raises
``ValueError`` with the reason and the fix. Pure: no IO, no apprise import (whether apprise
knows the resulting scheme is checked by ``kured.actuators.notify.check_url``).

Shoutrrr URLs translated (from shoutrrr's service docs, https://containrrr.dev/shoutrrr/v0.8/services/overview/):

* ``smtp://[user:password@]host[:port]/?from=ADDR&to=ADDR[,ADDR]`` (also ``fromaddress``,
  ``toaddresses``; ``encryption=None|ExplicitTLS|ImplicitTLS|Auto``, ``usestarttls=no``;
  ``subject``) → ``mailto://`` (``mode=insecure`` or ``starttls``) or ``mailtos://``
  (``mode=ssl``). Auto is shoutrrr's rule: implicit TLS on port 465, STARTTLS otherwise;
* ``generic://host[:port]/path`` (HTTPS unless ``disabletls=yes``), ``generic+http://``,
  ``generic+https://`` → ``json://`` / ``jsons://``: a POST of apprise's JSON body
  ``{"version","title","message","attachments","type"}``; the message is under ``message``, as
  in shoutrrr's ``template=json``;
* ``slack://[botname@]token-a/token-b/token-c`` (same in apprise), ``slack://hook:A-B-C@webhook``
  → ``slack://A/B/C``, ``slack://xoxb:TOKEN@CHANNEL`` → ``slack://xoxb-TOKEN/#CHANNEL``;
* ``discord://token@webhookid`` → ``discord://webhookid/token``;
* ``telegram://token@telegram?chats=a,b`` → ``tgram://token/a/b``;
* ``gotify://host[:port]/token`` (HTTPS unless ``disabletls=yes``) → ``gotifys://`` /
  ``gotify://``;
* ``pushover://shoutrrr:token@userkey`` → ``pover://userkey@token``.

Refused, with the fix in the message: ``teams://`` (shoutrrr's Office 365 connector webhooks;
Microsoft retired those connectors and apprise dropped them: use a Power Automate
``workflows://`` URL). Any other scheme is passed through as an apprise URL (``json://``,
``mailto://``, ``ntfy://``, ``workflows://``…) and refused at start if apprise does not know it.

Templates (``--message-template-*``) are kured's Go ``fmt`` strings with one argument, the node
name: every ``%s`` (or ``%v``) is replaced by it, ``%%`` is a literal ``%``; any other verb is
refused (Go would print ``%!d(string=…)``).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

# "back" is ours (kured #585): once the node is uncordoned after the reboot and its gates pass.
EVENTS = ("drain", "reboot", "uncordon", "back")
# kured 1.23's defaults (cmd/kured/main.go).
DEFAULT_TEMPLATES = {
    "drain": "Draining node %s",
    "reboot": "Rebooting node %s",
    "uncordon": "Node %s rebooted & uncordoned successfully!",
}
_VERB = re.compile(r"%(.)", re.DOTALL)
_TRUE = ("yes", "true", "1", "on")


def check_template(template: str) -> str:
    """``template`` if its verbs are ``%s``, ``%v`` or ``%%``; else ``ValueError``."""
    for match in _VERB.finditer(template.replace("%%", "")):
        if match.group(1) not in "sv":
            raise ValueError(
                f"unsupported verb %{match.group(1)} in {template!r}: use %s for the node name "
                "(%% for a literal %)"
            )
    if template.replace("%%", "").endswith("%"):
        raise ValueError(f"{template!r} ends with a lone %: write %% for a literal %")
    return template


def render(template: str, node: str) -> str:
    """The message for ``node``: each ``%s``/``%v`` replaced, ``%%`` made ``%``."""
    return _VERB.sub(lambda m: node if m.group(1) in "sv" else m.group(1), template)


def redact(url: str) -> str:
    """``scheme://host`` of ``url``: safe to log (tokens live in the user info and path)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"


def endpoint(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: safe to log or show in ``kured status`` (a hook's or
    Alertmanager's URL may carry a user and password, a token in its path or its query)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(an invalid URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _query(text: str) -> dict[str, str]:
    return {k.lower(): v for k, v in parse_qsl(text, keep_blank_values=True)}


def _smtp(query: dict[str, str], raw: str) -> str:
    split = urlsplit(raw)
    sender = query.pop("from", "") or query.pop("fromaddress", "")
    to = query.pop("to", "") or query.pop("toaddresses", "")
    if not sender or not to:
        raise ValueError(
            f"{redact(raw)}: an smtp:// URL needs ?from=ADDRESS&to=ADDRESS[,ADDRESS] (shoutrrr's "
            "fromaddress/toaddresses also work)"
        )
    encryption = query.pop("encryption", "auto").lower()
    starttls = query.pop("usestarttls", "yes").lower() in _TRUE
    port = split.port or 25
    if encryption == "none" or (encryption == "auto" and port != 465 and not starttls):
        scheme, mode = "mailto", "insecure"
    elif encryption == "implicittls" or (encryption == "auto" and port == 465):
        scheme, mode = "mailtos", "ssl"
    elif encryption in ("explicittls", "auto"):
        scheme, mode = "mailto", "starttls"
    else:
        raise ValueError(
            f"{redact(raw)}: encryption={encryption!r} is not None, ExplicitTLS, ImplicitTLS or Auto"
        )
    userinfo = split.netloc.rpartition("@")[0]
    host = split.netloc.rpartition("@")[2].rpartition(":")[0] if split.port else split.hostname
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    params = {"from": sender, "to": to, "mode": mode}
    return f"{scheme}://{netloc}?{urlencode(params)}"


def translate(url: str) -> str:
    """The apprise URL for one ``--notify-url`` (see the module docstring). Raises
    ``ValueError`` naming the problem and the fix; the message never shows secrets."""
    url = url.strip()
    split = urlsplit(url)
    scheme = split.scheme.lower()
    if not scheme or "://" not in url:
        raise ValueError(f"{url[:12]!r}… is not a URL (scheme://…)")
    query = _query(split.query)
    # As written: ``hostname`` lower-cases, and several services keep a token in the host.
    host = split.netloc.rpartition("@")[2]
    if split.port is not None:
        host = host.rpartition(":")[0]
    user = split.username or ""
    path = split.path.strip("/")
    if scheme == "smtp":
        return _smtp(query, url)
    if scheme in ("generic", "generic+http", "generic+https"):
        tls = scheme == "generic+https" or (
            scheme == "generic" and query.get("disabletls", "no").lower() not in _TRUE
        )
        port = f":{split.port}" if split.port else ""
        return f"{'jsons' if tls else 'json'}://{host}{port}/{path}"
    if scheme == "slack":
        if user == "hook" and host == "webhook":
            tokens = (split.password or "").split("-")
            return "slack://" + "/".join(tokens)
        if user in ("xoxb", "xoxp"):
            return f"slack://{user}-{split.password}/#{host}"
        return url
    if scheme == "discord":
        if not user or not host:
            raise ValueError(f"{redact(url)}: a discord:// URL is discord://TOKEN@WEBHOOKID")
        return f"discord://{host}/{user}"
    if scheme == "telegram":
        chats = [c for c in query.get("chats", "").split(",") if c]
        if not split.netloc.rpartition("@")[0] or not chats:
            raise ValueError(
                f"{redact(url)}: a telegram:// URL is telegram://TOKEN@telegram?chats=CHAT[,CHAT]"
            )
        token = split.netloc.rpartition("@")[0]
        return "tgram://" + quote(token, safe=":") + "/" + "/".join(quote(c) for c in chats)
    if scheme == "gotify":
        tls = query.get("disabletls", "no").lower() not in _TRUE
        port = f":{split.port}" if split.port else ""
        return f"{'gotifys' if tls else 'gotify'}://{host}{port}/{path}"
    if scheme == "pushover":
        if not split.password or not host:
            raise ValueError(
                f"{redact(url)}: a pushover:// URL is pushover://shoutrrr:TOKEN@USERKEY"
            )
        return f"pover://{host}@{split.password}"
    if scheme == "teams":
        raise ValueError(
            "teams:// (shoutrrr's Office 365 connector webhooks) has no equivalent: Microsoft "
            "retired those connectors. Create a Power Automate workflow webhook and give "
            "workflows://HOST/WORKFLOW/SIGNATURE (apprise) instead"
        )
    return url
