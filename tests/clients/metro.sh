#!/usr/bin/env bash
# Metro (React Native bundler) remote cache via metro-cache's HttpStore (npm metro-cache 0.87.1).
# Usage: metro.sh BASE_URL         e.g. metro.sh http://127.0.0.1:4000/api/metro/cache
# URL layout: BASE_URL is HttpStore's `endpoint`; it sends GET|PUT {BASE_URL}/{key as hex} (40 hex here).
#   PUT body: gzip (level 9) of JSON, or of 0x00 + raw bytes for a Buffer value; sent with
#   Transfer-Encoding: chunked, NO Content-Length and NO Content-Type; any 2xx = stored.
#   GET: only 200 is a hit (body gunzipped, so it must come back byte-for-byte, without Content-Encoding);
#   404 = miss; anything else throws HttpError.
# Env: TOKEN (sent as `Authorization: Bearer TOKEN` through HttpStore's `headers` option),
#      CLIENT_CONFIG (a directory: the HttpStore comes from its metro.config.js `cacheStores`),
#      KURA_TOOLS (default <repo>/.tools; metro-cache comes from $KURA_TOOLS/npm), KEEP=1.
# Hit detection: one HttpStore instance sets a JSON value and a Buffer value under fresh random keys; a
#   second, fresh instance (new agent, no shared state; HttpStore keeps no local cache) gets both back
#   and they compare equal.
# Exit 0 = REMOTE HIT; 1 = no hit (get returned null/different); 2 = setup error or set/get threw.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KURA_TOOLS="${KURA_TOOLS:-$REPO/.tools}"
NM="$KURA_TOOLS/npm/node_modules"
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
[ -f "$NM/metro-cache/package.json" ] || { echo "SETUP FAILED: $NM/metro-cache missing (run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-metro.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM

cat > "$W/probe.js" <<'EOF'
'use strict';
const crypto = require('node:crypto');
const util = require('node:util');
const {HttpStore} = require(process.env.METRO_CACHE_DIR);
const [endpoint, token] = [process.argv[2], process.env.TOKEN || ''];
const options = {endpoint, timeout: 10000};
if (token) options.headers = {Authorization: `Bearer ${token}`};
const config = process.env.CLIENT_CONFIG ? `${process.env.CLIENT_CONFIG}/metro.config.js` : '';
const newStore = () => {  // with CLIENT_CONFIG: the HttpStore of the user's own metro.config.js
  if (!config) return new HttpStore(options);
  delete require.cache[require.resolve(config)];  // a fresh instance each time
  const store = (require(config).cacheStores || []).find((s) => s instanceof HttpStore);
  if (!store) throw new Error(`${config} has no HttpStore in cacheStores`);
  return store;
};
const newKey = () => crypto.createHash('sha1').update(crypto.randomBytes(32)).digest();
const jsonKey = newKey(), bufKey = newKey();
const jsonValue = {kura: 'metro-probe', at: Date.now(), nested: [1, 'two', {three: 3}]};
const bufValue = crypto.randomBytes(1500);
(async () => {
  const writer = newStore();
  await writer.set(jsonKey, jsonValue);
  await writer.set(bufKey, bufValue);
  console.log(`run1: set ${jsonKey.toString('hex')} (json) and ${bufKey.toString('hex')} (buffer)`);
  const reader = newStore();          // fresh instance: nothing shared with the writer
  const gotJson = await reader.get(jsonKey);
  const gotBuf = await reader.get(bufKey);
  const okJson = util.isDeepStrictEqual(gotJson, jsonValue);
  const okBuf = Buffer.isBuffer(gotBuf) && gotBuf.equals(bufValue);
  console.log(`run2: json ${gotJson === null ? 'miss' : okJson ? 'round-tripped' : 'DIFFERENT'},` +
              ` buffer ${gotBuf === null ? 'miss' : okBuf ? 'round-tripped' : 'DIFFERENT'}`);
  process.exit(okJson && okBuf ? 0 : 1);
})().catch((err) => { console.log(`ERROR: ${err && err.stack || err}`); process.exit(2); });
EOF
METRO_CACHE_DIR="$NM/metro-cache" NODE_PATH="$NM" timeout 30 node "$W/probe.js" "$BASE" 2> "$W/stderr.log"; rc=$?
grep -v -iE 'EBADENGINE|engine' "$W/stderr.log" | head -5
case $rc in
  0) echo "REMOTE HIT (metro-cache $(node -p "require('$NM/metro-cache/package.json').version"))"; exit 0 ;;
  1) echo "NO REMOTE HIT"; exit 1 ;;
  *) echo "SETUP FAILED (rc=$rc)"; exit 2 ;;
esac
