#!/usr/bin/env bash
# Bazel (Debian bazel-bootstrap 4.2.3) "build without the bytes" under eviction pressure, against a
# kura gRPC cache. Usage: bazel_retention.sh grpc://HOST:PORT    Env: BUILDS (default 20), KEEP=1.
# The workspace: //:lib (20 KiB) is built once (the seed) and is a remote cache hit in every later
# build; build k builds //:use_k, which needs lib's output and four new 300 KiB genrules
# (big_k_1..4), run and uploaded first. With --remote_download_minimal Bazel does not download
# lib's output at the hit; it fetches it from the cache when use_k runs, after its own 1.2 MiB of
# uploads. Against a node whose disk budget is 1 MiB those uploads push lib's output out unless
# the node keeps what it told Bazel exists (KURA_MIN_RETENTION): Bazel then fails with "Failed to
# fetch file ... --remote_download_outputs=minimal does not work if your remote cache evicts files
# during builds" (lost inputs). `bazel clean --expunge` runs between builds.
# Output: "build K ok: ... remote cache hit" per build; on the first failure "build K FAILED" and
# its error lines, then exit 1. Exit 0 = every build passed; 2 = setup error (the seed failed).
set -u
URL="${1:?usage: $0 grpc://HOST:PORT}"
BUILDS="${BUILDS:-20}"
BAZEL_BIN="${BAZEL_BIN:-$(command -v bazel || true)}"
[ -n "$BAZEL_BIN" ] && [ -x "$BAZEL_BIN" ] || { echo "SETUP FAILED: no bazel (run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-bazel-retention.XXXXXX")" || exit 2
ROOT="$W/root"
bz() {  # bazel with this run's own output user root; home and workspace rc files ignored. Every
  # build starts a new server (after --expunge): a JVM that only compiles with C1 and collects
  # serially starts about a quarter faster on a loaded machine (8 s -> 6 s a build here).
  timeout 120 "$BAZEL_BIN" --nohome_rc --noworkspace_rc --output_user_root="$ROOT" \
    --host_jvm_args=-XX:TieredStopAtLevel=1 --host_jvm_args=-XX:+UseSerialGC \
    --max_idle_secs=60 "$@"
}
cleanup() {
  (cd "$W/ws" 2>/dev/null && bz shutdown >/dev/null 2>&1)
  [ "${KEEP:-0}" = 1 ] && echo "kept $W" || { chmod -R u+w "$W" 2>/dev/null; rm -rf "$W"; }
}
trap cleanup EXIT
trap 'exit 2' INT TERM
mkdir -p "$W/ws" && cd "$W/ws" || exit 2
: > WORKSPACE
{
  echo 'genrule(name = "lib", outs = ["lib.txt"], cmd = "dd if=/dev/zero bs=1024 count=20 of=$@ 2>/dev/null")'
  for k in $(seq 1 "$BUILDS"); do
    bigs=""
    for i in 1 2 3 4; do
      echo "genrule(name = \"big_${k}_$i\", outs = [\"big_${k}_$i.bin\"], cmd = \"head -c 307200 /dev/urandom > \$@\")"
      bigs="$bigs\":big_${k}_$i\", "
    done
    echo "genrule(name = \"use_$k\", srcs = [\":lib\", $bigs], outs = [\"use_$k.txt\"], cmd = \"wc -c < \$(location :lib) > \$@\")"
  done
} > BUILD
FLAGS=(--remote_cache="$URL" --remote_download_minimal --remote_timeout=20 --spawn_strategy=local
       --jobs=2 --color=no --curses=no --show_progress=no)

bz build //:lib "${FLAGS[@]}" > "$W/seed.log" 2>&1 || {
  echo "SETUP FAILED: the seed build failed"; tail -20 "$W/seed.log"; exit 2; }
for k in $(seq 1 "$BUILDS"); do
  bz clean --expunge > /dev/null 2>&1
  if bz build "//:use_$k" "${FLAGS[@]}" > "$W/build$k.log" 2>&1; then
    echo "build $k ok: $(grep -m1 -E '[0-9]+ process(es)?:' "$W/build$k.log")"
  else
    echo "build $k FAILED"
    grep -E 'ERROR|Failed to fetch|lost input|does not exist remotely' "$W/build$k.log" | head -10
    exit 1
  fi
done
echo "ALL $BUILDS BUILDS OK"
