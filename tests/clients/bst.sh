#!/usr/bin/env bash
# BuildStream 2 artifact cache (PyPI buildstream 2.8.1) over kura's gRPC port.
# Usage: bst.sh BASE_URL            e.g. bst.sh grpc://127.0.0.1:9092 (or http://…: BuildStream's
#   spelling of plain gRPC, which the script passes it); grpcs://… or https://… for TLS (with CA)
# What BuildStream needs at run time: the wheel bundles buildbox-casd and buildbox-run (its local CAS
#   daemon and sandbox runner), and buildbox-run refuses to start without bubblewrap's `bwrap`
#   (Debian package bubblewrap) even when, as here, the only element is an `import` that runs no
#   sandbox. Both come from scripts/install-deps.
# Requests (through buildbox-casd): Remote Asset FetchBlob/PushBlob (an empty request of each first,
#   answered INVALID_ARGUMENT, as BuildStream's probe expects), then FetchDirectory/PushDirectory for
#   the sources and FindMissingBlobs, BatchUpdateBlobs/ByteStream, BatchReadBlobs and GetTree for the
#   content.
# Env: TOKEN (written to a file BuildStream reads as `auth: access-token`; buildbox-casd sends a token
#   over TLS only: "Secure Channel options cannot be used with this URL" on http://), CA (the PEM CA
#   certificate of a grpcs:// node, as `auth: server-cert`), BST_BIN (default <repo>/.venv/bin/bst),
#   KEEP=1.
# Setup: one project with one `import` element of a file that changes every run; checkout 1 builds
#   and pushes (`artifacts: servers: [{url, push: true}]`); checkout 2, a copy of the project with its
#   own empty cache directory, builds again.
# Hit detection: checkout 2's build pulled the artifact ("Pull Queue: processed 1") and built nothing
#   ("Build Queue: processed 0"), and its checked-out file is identical.
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error (or checkout 1 failed).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
case "$BASE" in grpcs://*|https://*) URL="https://${BASE#*://}" ;; *) URL="http://${BASE#*://}" ;; esac
BST_BIN="${BST_BIN:-$REPO/.venv/bin/bst}"
[ -x "$BST_BIN" ] || { echo "SETUP FAILED: no bst at $BST_BIN (run scripts/install-deps)"; exit 2; }
command -v bwrap >/dev/null || { echo "SETUP FAILED: no bwrap (Debian bubblewrap; run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-bst.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM
mkdir -p "$W/p1/elements" "$W/p1/files" || exit 2
echo "kura bst $(date +%s%N) $$ $RANDOM" > "$W/p1/files/hello.txt"
printf 'name: kuratest\nmin-version: 2.0\nelement-path: elements\n' > "$W/p1/project.conf"
printf 'kind: import\nsources:\n- kind: local\n  path: files\n' > "$W/p1/elements/hello.bst"
cp -r "$W/p1" "$W/p2"
for n in 1 2; do
  {
    printf 'cachedir: %s\nlogdir: %s\nscheduler:\n  network-retries: 0\n' "$W/cache$n" "$W/logs$n"
    printf 'artifacts:\n  servers:\n  - url: %s\n    push: true\n' "$URL"
    [ -n "${TOKEN:-}${CA:-}" ] && printf '    auth:\n'
    [ -n "${CA:-}" ] && printf '      server-cert: %s\n' "$CA"
    if [ -n "${TOKEN:-}" ]; then
      printf '%s' "$TOKEN" > "$W/token"
      printf '      access-token: %s\n' "$W/token"
    fi
  } > "$W/bst$n.conf"
done
run() {  # $1 = checkout number
  (cd "$W/p$1" && timeout 120 "$BST_BIN" --no-interactive --no-colors --config "$W/bst$1.conf" \
    build hello.bst) > "$W/run$1.log" 2>&1
}
summary() { grep -E 'Pull Queue|Build Queue|Push Queue' "$W/run$1.log" | tr -s ' ' | paste -sd ';'; }

run 1; rc1=$?
echo "run1 rc=$rc1: $(summary 1)"
[ $rc1 = 0 ] && grep -qE 'Push Queue: +processed 1' "$W/run1.log" || {
  echo "SETUP FAILED: checkout 1 did not build and push"; grep -E "WARNING|ERROR|FAILURE" "$W/run1.log"; exit 2; }
run 2; rc2=$?
echo "run2 rc=$rc2: $(summary 2)"
(cd "$W/p2" && timeout 60 "$BST_BIN" --no-interactive --config "$W/bst2.conf" \
  artifact checkout hello.bst --directory "$W/out") > "$W/checkout.log" 2>&1
if [ $rc2 = 0 ] && grep -qE 'Pull Queue: +processed 1' "$W/run2.log" \
   && grep -qE 'Build Queue: +processed 0' "$W/run2.log" && cmp -s "$W/out/hello.txt" "$W/p1/files/hello.txt"; then
  echo "REMOTE HIT (buildstream $("$BST_BIN" --version 2>/dev/null))"; exit 0
fi
echo "NO REMOTE HIT"; tail -15 "$W/run2.log"; tail -5 "$W/checkout.log"; exit 1
