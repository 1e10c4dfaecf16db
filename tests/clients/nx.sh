#!/usr/bin/env bash
# Nx self-hosted remote cache (built into the `nx` npm package; no plugin or licence needed).
# Usage: nx.sh BASE_URL            e.g. nx.sh http://127.0.0.1:4000
# URL layout: GET/PUT {BASE_URL}/v1/cache/{hash}  (hash = decimal u64; body = tar.gz).
#   The server MUST answer PUT with 200 (409/403 are tolerated); 201/204 make Nx retry and fail the run.
# Env: TOKEN (sent as `Authorization: Bearer TOKEN`; none sent if unset),
#      CLIENT_CONFIG (a directory: its `env` file is sourced instead of the two NX_ settings above),
#      KURA_TOOLS (default <repo>/.tools; nx comes from $KURA_TOOLS/npm, see scripts/install-deps), KEEP=1,
#      INPUT (the build's input text: the same one gives the same cache key in any workspace; default
#      unique, so run 1 must miss).
# Hit detection: run 2 (after deleting .nx/ and the outputs) prints "Nx read the output from the cache"
#   and restores the output file.
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error (or run 1 failed).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KURA_TOOLS="${KURA_TOOLS:-$REPO/.tools}"
NM="$KURA_TOOLS/npm/node_modules"
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
[ -x "$NM/.bin/nx" ] || { echo "SETUP FAILED: $NM/.bin/nx missing (run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-nx.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM
cd "$W" || exit 2

mkdir -p packages/a
echo '{"name":"nxws","version":"0.0.0","private":true}' > package.json
echo '{"targetDefaults":{"build":{"cache":true}},"neverConnectToCloud":true}' > nx.json
cat > packages/a/project.json <<'EOF'
{"name":"a","root":"packages/a","targets":{"build":{"executor":"nx:run-commands",
 "options":{"command":"mkdir -p packages/a/dist && cat packages/a/src.txt > packages/a/dist/out.txt && echo BUILT-A"},
 "cache":true,"inputs":["{projectRoot}/src.txt"],"outputs":["{projectRoot}/dist"]}}}
EOF
echo "${INPUT:-nx kura $(date +%s%N) $$ $RANDOM}" > packages/a/src.txt   # unique input => run 1 must miss
# Nx looks for its own package in the workspace's node_modules: point it at the pre-installed tree.
ln -s "$NM" node_modules
git init -q . >/dev/null 2>&1 || true

export NX_DAEMON=false NX_NO_CLOUD=true NX_TUI=false NX_SKIP_NX_CACHE=false NX_VERBOSE_LOGGING=false \
       NX_SELF_HOSTED_REMOTE_CACHE_SERVER="$BASE"
unset NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN
[ -n "${TOKEN:-}" ] && export NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN="$TOKEN"
if [ -n "${CLIENT_CONFIG:-}" ]; then   # the user's own lines instead (README.md "Nx")
  unset NX_SELF_HOSTED_REMOTE_CACHE_SERVER NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN
  . "$CLIENT_CONFIG/env" || { echo "SETUP FAILED: cannot source $CLIENT_CONFIG/env"; exit 2; }
fi
run() { timeout 40 "$NM/.bin/nx" run a:build --outputStyle=static > "$1" 2>&1; }

run run1.log; rc1=$?
echo "run1 rc=$rc1"
[ $rc1 = 0 ] || { echo "SETUP FAILED: first nx run failed"; tail -20 run1.log; exit 2; }
rm -rf .nx packages/a/dist          # wipe ALL local Nx state (cache dir + task DB) and the outputs
run run2.log; rc2=$?
echo "run2 rc=$rc2: $(grep -m1 'Cache:' run2.log | sed 's/^ *//')"
if [ $rc2 = 0 ] && grep -q 'Nx read the output from the cache' run2.log \
   && cmp -s packages/a/src.txt packages/a/dist/out.txt; then
  echo "REMOTE HIT (nx $(node -p "require('$NM/nx/package.json').version"))"; exit 0
fi
echo "NO REMOTE HIT"; tail -20 run2.log; exit 1
