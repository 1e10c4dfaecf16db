#!/usr/bin/env bash
# ccache HTTP remote storage (Debian ccache 4.7.5).
# Usage: ccache.sh BASE_URL        e.g. ccache.sh http://127.0.0.1:4000
# URL layout: {BASE_URL}{PREFIX}/<key>, PREFIX default /cache. With LAYOUT=subdirs (default) the key is
#   split as /XX/<rest>; flat: /<key>; bazel: /ac/<key padded to 64 hex>.
#   GET -> 200 body | 404 miss; PUT (Content-Type application/octet-stream, Content-Length) -> any 2xx.
#   Two objects per compile (manifest + result). ccache sends no HEAD.
# Env: PREFIX (default /cache; set PREFIX= to put keys right under BASE_URL), LAYOUT=subdirs|flat|bazel,
#      TOKEN (sent as `Authorization: Bearer TOKEN`), CCACHE_BIN (default: ccache on PATH), KEEP=1,
#      CLIENT_CONFIG (a directory: its `env` file, sourced, sets CCACHE_REMOTE_STORAGE instead),
#      INPUT (letters and digits printed by the program: the same one gives the same keys in any
#      directory; default unique, so run 1 must miss).
# Hit detection: after wiping CCACHE_DIR, `ccache --print-stats` shows remote_storage_hit >= 1 and the
#   object file is byte-identical to the first compile's.
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error.
set -u
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
CCACHE_BIN="${CCACHE_BIN:-$(command -v ccache || true)}"
[ -n "$CCACHE_BIN" ] && [ -x "$CCACHE_BIN" ] || { echo "SETUP FAILED: no ccache (run scripts/install-deps)"; exit 2; }
command -v gcc >/dev/null || { echo "SETUP FAILED: no gcc"; exit 2; }
LAYOUT="${LAYOUT:-subdirs}"
PREFIX="${PREFIX-/cache}"
PREFIX="${PREFIX%/}"

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-ccache.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM
cd "$W" || exit 2

cat > hello.c <<EOF
#include <stdio.h>
int main(void){ printf("hello %s\\n", "${INPUT:-kura-$(date +%s%N)-$$-$RANDOM}"); return 0; }
EOF
unset CCACHE_NOREMOTE_STORAGE CCACHE_RECACHE CCACHE_DISABLE CCACHE_READONLY CCACHE_REMOTE_ONLY
export CCACHE_DIR="$W/ccache-local" CCACHE_CONFIGPATH="$W/ccache.conf" CCACHE_BASEDIR="$W"
export CCACHE_LOGFILE="$W/ccache.log"   # its remote-storage lines are printed when there is no hit
: > "$CCACHE_CONFIGPATH"
URL="${BASE}${PREFIX}|layout=${LAYOUT}"
[ -n "${TOKEN:-}" ] && URL="${URL}|bearer-token=${TOKEN}"
export CCACHE_REMOTE_STORAGE="$URL"
if [ -n "${CLIENT_CONFIG:-}" ]; then   # the user's own line instead (README.md "ccache")
  unset CCACHE_REMOTE_STORAGE
  . "$CLIENT_CONFIG/env" || { echo "SETUP FAILED: cannot source $CLIENT_CONFIG/env"; exit 2; }
  URL="$CCACHE_REMOTE_STORAGE"
fi
stat_of() { "$CCACHE_BIN" --print-stats | awk -v k="$1" '$1==k{print $2}'; }
echo "ccache $("$CCACHE_BIN" --version | head -1 | awk '{print $3}'); remote_storage=${URL%%|bearer-token=*}"

timeout 30 "$CCACHE_BIN" gcc -c hello.c -o a.o || { echo "SETUP FAILED: first compile"; exit 2; }
echo "run1: remote_storage_miss=$(stat_of remote_storage_miss) write=$(stat_of remote_storage_write) error=$(stat_of remote_storage_error)"
rm -rf "$CCACHE_DIR"                   # wipe the whole local cache
timeout 30 "$CCACHE_BIN" gcc -c hello.c -o b.o || { echo "SETUP FAILED: second compile"; exit 2; }
hit=$(stat_of remote_storage_hit)
echo "run2: remote_storage_hit=${hit:-0} miss=$(stat_of remote_storage_miss) error=$(stat_of remote_storage_error)"
if [ "${hit:-0}" -ge 1 ] && cmp -s a.o b.o; then echo "REMOTE HIT (ccache, layout=$LAYOUT)"; exit 0; fi
echo "NO REMOTE HIT"; "$CCACHE_BIN" --print-stats | grep remote
echo "--- ccache log, remote storage ---"
grep -iE "remote|http|fail|error|timeout|stored|retrieved|No [0-9a-z]+ in" "$CCACHE_LOGFILE" | grep -v "Config:" | tail -40
exit 1
