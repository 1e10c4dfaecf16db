#!/usr/bin/env bash
# Gradle HTTP build cache (Debian gradle 4.4.1 on the machine's JDK).
# Usage: gradle.sh BASE_URL        e.g. gradle.sh http://127.0.0.1:4000/cache/
# URL layout: BASE_URL is the cache root itself (include the prefix); Gradle sends
#   GET|PUT {BASE_URL}/{32-hex key}. PUT: Content-Type application/vnd.gradle.build-cache-artifact.v1,
#   Content-Length, gzip tar body; any 2xx accepted. GET 200 = hit, 404 = miss.
# Env: TOKEN (sent as HTTP Basic auth user "kura", password TOKEN — Gradle 4.4 has no bearer option; Gradle
#      sends it preemptively), GRADLE_BIN (default: gradle on PATH), KEEP=1,
#      CLIENT_CONFIG (a directory: its settings.gradle and gradle.properties are the project's own,
#      and gradle runs without --build-cache), INPUT (letters and digits compiled in: the same one gives
#      the same cache key in any directory; default unique, so run 1 must miss).
# Setup: settings.gradle turns the local (directory) build cache OFF and points HttpBuildCache at BASE_URL
#   with push=true; each run gets a fresh GRADLE_USER_HOME and build/ + .gradle/ are deleted in between.
#   Runs with --no-daemon --build-cache (never --offline: that disables the remote cache).
# Hit detection: run 2 prints ":compileJava FROM-CACHE" (--console=plain) and the class file is back.
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error (or run 1 failed).
set -u
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}/"
GRADLE_BIN="${GRADLE_BIN:-$(command -v gradle || true)}"
[ -n "$GRADLE_BIN" ] && [ -x "$GRADLE_BIN" ] || { echo "SETUP FAILED: no gradle (run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-gradle.XXXXXX")" || exit 2
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 2' INT TERM
cd "$W/" || exit 2
mkdir -p proj/src/main/java/kura && cd proj || exit 2

CRED=""
[ -n "${TOKEN:-}" ] && CRED="credentials { username = 'kura'; password = System.getenv('KURA_GRADLE_TOKEN') }"
cat > settings.gradle <<EOF
rootProject.name = 'kuraprobe'
buildCache {
  local(DirectoryBuildCache) { enabled = false }
  remote(HttpBuildCache) {
    url = '${BASE}'
    push = true
    ${CRED}
  }
}
EOF
BUILD_CACHE=--build-cache
if [ -n "${CLIENT_CONFIG:-}" ]; then   # the user's own files instead (README.md "Gradle")
  { echo "rootProject.name = 'kuraprobe'"; cat "$CLIENT_CONFIG/settings.gradle"; } > settings.gradle || exit 2
  cp "$CLIENT_CONFIG/gradle.properties" gradle.properties || exit 2
  BUILD_CACHE=""                       # gradle.properties must turn the build cache on by itself
fi
echo "apply plugin: 'java'" > build.gradle
cat > src/main/java/kura/Probe.java <<EOF
package kura;
public class Probe { public static final String ID = "${INPUT:-kura-$(date +%s%N)-$$-$RANDOM}"; }
EOF
export KURA_GRADLE_TOKEN="${TOKEN:-}"
unset GRADLE_OPTS JAVA_TOOL_OPTIONS
run() {  # $1 = log, $2 = fresh GRADLE_USER_HOME
  timeout 120 "$GRADLE_BIN" --no-daemon $BUILD_CACHE --console=plain -g "$2" compileJava > "$1" 2>&1
}
CLASS=build/classes/java/main/kura/Probe.class

run ../run1.log "$W/guh1"; rc1=$?
echo "run1 rc=$rc1: $(grep -m1 -E ':compileJava' ../run1.log)"
[ $rc1 = 0 ] && [ -s "$CLASS" ] || { echo "SETUP FAILED: first gradle run failed"; tail -20 ../run1.log; exit 2; }
cp "$CLASS" ../first.class
rm -rf build .gradle "$W/guh1"        # wipe outputs, project cache state and the whole Gradle user home
run ../run2.log "$W/guh2"; rc2=$?
echo "run2 rc=$rc2: $(grep -m1 -E ':compileJava' ../run2.log)"
if [ $rc2 = 0 ] && grep -qE ':compileJava FROM-CACHE' ../run2.log && cmp -s "$CLASS" ../first.class; then
  echo "REMOTE HIT (gradle $(dpkg-query -W -f='${Version}' gradle 2>/dev/null))"; exit 0
fi
echo "NO REMOTE HIT"; grep -iE 'cache|warn|error|fail' ../run2.log | head -10; exit 1
