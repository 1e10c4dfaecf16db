#!/usr/bin/env bash
# Turborepo remote cache (npm `turbo`), Vercel Remote Cache API v8.
# Usage: turbo.sh BASE_URL         e.g. turbo.sh http://127.0.0.1:4000
# URL layout (turbo appends the paths itself, so BASE_URL has no /v8):
#   GET {BASE_URL}/v8/artifacts/status?slug=TEAM, GET|PUT {BASE_URL}/v8/artifacts/{hash}?slug=TEAM,
#   POST {BASE_URL}/v8/artifacts/events?slug=TEAM.  PUT body is a zstd tar.
# Env: TOKEN (Bearer token; default tok123 — turbo disables remote caching without one),
#      TEAM (sent as ?slug=, default team1), TEAMID (sent as ?teamId= instead of slug),
#      SIGNATURE_KEY (turns on remoteCache.signature; server must echo x-artifact-tag on GET),
#      CLIENT_CONFIG (a directory: its `env` file is sourced and turbo runs with no --api/--token/--team),
#      KURA_TOOLS (default <repo>/.tools; turbo comes from $KURA_TOOLS/npm), KEEP=1,
#      INPUT (the build's input text: the same one gives the same hash in any workspace; default unique).
# Hit detection: run 2 (after deleting .turbo/ and the outputs) prints "a:build: cache hit" and the
#   output file is restored. The workspace is a committed git repo (turbo hashes git-tracked inputs).
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error (or run 1 failed).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KURA_TOOLS="${KURA_TOOLS:-$REPO/.tools}"
NM="$KURA_TOOLS/npm/node_modules"
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
TOKEN="${TOKEN:-tok123}"
TEAM="${TEAM:-team1}"
[ -x "$NM/.bin/turbo" ] || { echo "SETUP FAILED: $NM/.bin/turbo missing (run scripts/install-deps)"; exit 2; }
TURBO_VERSION="$(node -p "require('$NM/turbo/package.json').version")" || exit 2

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-turbo.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM
cd "$W" || exit 2

mkdir -p packages/a node_modules
cat > package.json <<EOF
{"name":"turbows","private":true,"packageManager":"npm@$(npm --version)","workspaces":["packages/*"],
 "devDependencies":{"turbo":"${TURBO_VERSION}"}}
EOF
if [ -n "${SIGNATURE_KEY:-}" ]; then
  echo '{"remoteCache":{"signature":true},"tasks":{"build":{"outputs":["dist/**"]}}}' > turbo.json
  export TURBO_REMOTE_CACHE_SIGNATURE_KEY="$SIGNATURE_KEY"
else
  echo '{"tasks":{"build":{"outputs":["dist/**"]}}}' > turbo.json
fi
cat > packages/a/package.json <<'EOF'
{"name":"a","version":"1.0.0","scripts":{"build":"mkdir -p dist && cp src.txt dist/out.txt && echo BUILT-A"}}
EOF
echo "${INPUT:-turbo kura $(date +%s%N) $$ $RANDOM}" > packages/a/src.txt   # unique input => run 1 must miss
# What `npm install` would have made, without touching the registry: the pre-installed turbo
# (+ its platform binary package) and the workspace link.
ln -s "$NM/turbo" node_modules/turbo
ln -s "$NM/@turbo" node_modules/@turbo
ln -s ../packages/a node_modules/a
# A minimal npm lockfile so turbo can build its package graph (it warns without one).
cat > package-lock.json <<EOF
{"name":"turbows","lockfileVersion":3,"requires":true,"packages":{
 "":{"name":"turbows","workspaces":["packages/*"],"devDependencies":{"turbo":"${TURBO_VERSION}"}},
 "node_modules/a":{"resolved":"packages/a","link":true},
 "node_modules/turbo":{"version":"${TURBO_VERSION}","dev":true},
 "packages/a":{"name":"a","version":"1.0.0"}}}
EOF
printf 'node_modules\ndist\n.turbo\n*.log\n' > .gitignore
# turbo hashes git-tracked inputs: commit so its own log files don't change the hash
git init -q . && git add -A && git -c user.email=k@k -c user.name=k commit -qm init || exit 2

export TURBO_TELEMETRY_DISABLED=1 DO_NOT_TRACK=1 TURBO_NO_UPDATE_NOTIFIER=1 TURBO_UI=false
if [ -n "${TEAMID:-}" ]; then export TURBO_TEAMID="$TEAMID"; TEAMARG=(); else TEAMARG=(--team "$TEAM"); fi
if [ -n "${CLIENT_CONFIG:-}" ]; then   # the user's own lines instead (README.md "Turborepo")
  unset TURBO_API TURBO_TOKEN TURBO_TEAM TURBO_TEAMID
  . "$CLIENT_CONFIG/env" || { echo "SETUP FAILED: cannot source $CLIENT_CONFIG/env"; exit 2; }
  run() { timeout 40 "$NM/.bin/turbo" run build > "$1" 2>&1; }
else
  run() { timeout 40 "$NM/.bin/turbo" run build --api="$BASE" --token="$TOKEN" "${TEAMARG[@]}" > "$1" 2>&1; }
fi

run run1.log; rc1=$?
echo "run1 rc=$rc1: $(grep -m1 -E 'a:build: cache' run1.log)"
[ $rc1 = 0 ] || { echo "SETUP FAILED: first turbo run failed"; tail -20 run1.log; exit 2; }
rm -rf .turbo packages/a/.turbo packages/a/dist node_modules/.cache/turbo
run run2.log; rc2=$?
echo "run2 rc=$rc2: $(grep -m1 -E 'a:build: cache' run2.log)"
grep -i 'warn' run2.log | head -3
if [ $rc2 = 0 ] && grep -q 'a:build: cache hit' run2.log && cmp -s packages/a/src.txt packages/a/dist/out.txt; then
  echo "REMOTE HIT (turbo ${TURBO_VERSION})"; exit 0
fi
echo "NO REMOTE HIT"; tail -20 run2.log; exit 1
