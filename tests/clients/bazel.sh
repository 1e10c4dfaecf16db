#!/usr/bin/env bash
# Bazel HTTP remote cache (Debian bazel-bootstrap 4.2.3), genrule-only workspace (no external repos).
# Usage: bazel.sh BASE_URL         e.g. bazel.sh http://127.0.0.1:4000/cache
# URL layout: BASE_URL is the cache root (include the prefix); Bazel sends
#   GET {BASE_URL}/ac/{sha256} (200 = ActionResult proto, 404 = miss), then GET {BASE_URL}/cas/{sha256}
#   for each output; on a miss PUT {BASE_URL}/cas/{sha256} (outputs, stdout/stderr, Command, Action)
#   and finally PUT {BASE_URL}/ac/{sha256}. Any 2xx accepted for PUT.
# Env: TOKEN (sent as `Authorization: Bearer TOKEN` via --remote_header), CA (a PEM CA certificate to
#      trust for an https:// BASE_URL: Bazel 4.2's HTTP cache ignores --tls_certificate, which only its
#      gRPC cache reads, so the CA goes into a JVM trust store, -Djavax.net.ssl.trustStore), BAZEL_BIN
#      (default: bazel on PATH), CLIENT_CONFIG (a directory: its `bazelrc` replaces --remote_cache
#      and the token), KEEP=1. BASE_URL may also be grpc://HOST:PORT (Bazel's gRPC REAPI cache; the
#      token then goes as gRPC metadata).
#      INSTANCE (--remote_instance_name, e.g. org/team-1).
#      TARGET=genrule (default: a genrule, no external repositories) or cc (a C cc_binary, compiled
#      and linked by the local gcc: this Bazel's @bazel_tools loads its C++ and Java rule names from
#      @rules_cc and @rules_java, which it would download, so the script writes two tiny repositories
#      that give Bazel's own native rules those names, and passes them with --override_repository),
#      or archive (an http_archive the genrule reads, served by `python3 -m http.server` on
#      127.0.0.1:ORIGIN_PORT and fetched with --experimental_remote_downloader=BASE_URL, the repository
#      cache off; between the runs the origin is stopped and run 1's output base cleaned with
#      `bazel clean --expunge`, so run 2 can only get the archive from the downloader).
# Setup: each run has its own --output_base under a per-script --output_user_root in the temp dir (so no
#   local action cache, disk cache or outputs survive), home/workspace rc files ignored, no --disk_cache. Both Bazel
#   servers are shut down at the end (and --max_idle_secs bounds them if this script is killed -9).
# Hit detection: run 2 reports "N remote cache hit(s)" and the output file is identical (cc: the
#   binary, which must also run).
# Exit 0 = REMOTE HIT; 1 = no hit; 2 = setup error (or run 1 failed).
set -u
BASE="${1:?usage: $0 BASE_URL}"
BASE="${BASE%/}"
BAZEL_BIN="${BAZEL_BIN:-$(command -v bazel || true)}"
[ -n "$BAZEL_BIN" ] && [ -x "$BAZEL_BIN" ] || { echo "SETUP FAILED: no bazel (run scripts/install-deps)"; exit 2; }

W="$(mktemp -d "${TMPDIR:-/tmp}/kura-bazel.XXXXXX")" || exit 2
ROOT="$W/root"
# Debian's bazel is not a self-extracting binary: its system rc (/etc/bazel/bazelrc) supplies
# --install_base=/usr/share/bazel --trust_install_base, so only the home and workspace rc files are
# skipped (--ignore_all_rc_files breaks it). BAZEL_INSTALL_BASE overrides the install base explicitly.
bz() {  # $1 = run number (selects the output_base), then a timeout in seconds, then bazel's arguments
  local n="$1" t="$2"; shift 2
  local startup=(--nohome_rc --noworkspace_rc --output_user_root="$ROOT" --output_base="$ROOT/ob$n"
                 --max_idle_secs=60)
  [ -n "${CLIENT_CONFIG:-}" ] && startup+=(--bazelrc="$CLIENT_CONFIG/bazelrc")
  [ -n "${BAZEL_INSTALL_BASE:-}" ] && startup+=(--install_base="$BAZEL_INSTALL_BASE" --trust_install_base)
  [ -n "${CA:-}" ] && startup+=(--host_jvm_args=-Djavax.net.ssl.trustStore="$W/trust.p12"
                                --host_jvm_args=-Djavax.net.ssl.trustStorePassword=changeit)
  timeout "$t" "$BAZEL_BIN" "${startup[@]}" "$@"
}
cleanup() {
  [ -n "${ORIGIN_PID:-}" ] && kill "$ORIGIN_PID" 2>/dev/null
  for i in 1 2; do
    [ -d "$ROOT/ob$i" ] && (cd "$W/ws" 2>/dev/null && bz "$i" 20 shutdown >/dev/null 2>&1)
  done
  # Bazel marks parts of its install/output trees read-only.
  [ "${KEEP:-0}" = 1 ] && echo "kept $W" || { chmod -R u+w "$W" 2>/dev/null; rm -rf "$W"; }
}
trap cleanup EXIT
trap 'exit 2' INT TERM
mkdir -p "$W/ws" && cd "$W/ws" || exit 2
if [ -n "${CA:-}" ]; then
  command -v keytool >/dev/null || { echo "SETUP FAILED: no keytool (a JDK) for CA"; exit 2; }
  keytool -importcert -noprompt -alias kura-ca -file "$CA" -keystore "$W/trust.p12" \
    -storetype PKCS12 -storepass changeit >/dev/null 2>&1 || { echo "SETUP FAILED: keytool"; exit 2; }
fi

: > WORKSPACE
FLAGS=(--remote_accept_cached --remote_upload_local_results --remote_timeout=20 --spawn_strategy=local --color=no --curses=no --show_progress=no)
case "${TARGET:-genrule}" in
  genrule)
    TGT=//:gen OUT=bazel-bin/out.txt
    cat > BUILD <<EOF
genrule(
    name = "gen",
    outs = ["out.txt"],
    cmd = "echo 'kura $(date +%s%N) $$ $RANDOM' > \$@",
)
EOF
    ;;
  cc)
    TGT=//:hello OUT=bazel-bin/hello
    stub_rules() {  # $1 = repository dir, $2 = package, then the rule names
      local dir="$1" pkg="$2"; shift 2
      mkdir -p "$dir/$pkg" && : > "$dir/WORKSPACE" && : > "$dir/BUILD" && : > "$dir/$pkg/BUILD"
      for rule in "$@"; do printf 'def %s(**attrs):\n    native.%s(**attrs)\n\n' "$rule" "$rule"; done > "$dir/$pkg/defs.bzl"
    }
    stub_rules "$W/rules_cc" cc cc_binary cc_library cc_test cc_import cc_proto_library cc_toolchain cc_toolchain_suite objc_library
    stub_rules "$W/rules_java" java java_binary java_import java_library java_plugin java_proto_library java_runtime java_test java_toolchain
    FLAGS+=(--override_repository=rules_cc="$W/rules_cc" --override_repository=rules_java="$W/rules_java")
    printf '#include <stdio.h>\nint main(void){ puts("kura %s"); return 0; }\n' "$(date +%s%N)-$$-$RANDOM" > hello.c
    printf 'cc_binary(name = "hello", srcs = ["hello.c"])\n' > BUILD
    ;;
  archive)
    [ -n "${ORIGIN_PORT:-}" ] || { echo "SETUP FAILED: TARGET=archive needs ORIGIN_PORT"; exit 2; }
    TGT=//:gen OUT=bazel-bin/out.txt
    mkdir -p "$W/origin/dep" && echo "kura archive $(date +%s%N) $$ $RANDOM" > "$W/origin/dep/data.txt"
    tar -C "$W/origin" -czf "$W/origin/dep.tar.gz" dep || exit 2
    sha="$(sha256sum "$W/origin/dep.tar.gz" | cut -d' ' -f1)"
    (cd "$W/origin" && exec python3 -m http.server --bind 127.0.0.1 "$ORIGIN_PORT") > "$W/origin.log" 2>&1 &
    ORIGIN_PID=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$ORIGIN_PORT") 2>/dev/null && break; sleep 0.1; done
    cat > WORKSPACE <<EOF
load("@bazel_tools//tools/build_defs/repo:http.bzl", "http_archive")
http_archive(
    name = "dep",
    urls = ["http://127.0.0.1:$ORIGIN_PORT/dep.tar.gz"],
    sha256 = "$sha",
    strip_prefix = "dep",
    build_file_content = 'exports_files(["data.txt"])',
)
EOF
    cat > BUILD <<'EOF'
genrule(
    name = "gen",
    srcs = ["@dep//:data.txt"],
    outs = ["out.txt"],
    cmd = "cat $< > $@",
)
EOF
    FLAGS+=(--experimental_remote_downloader="$BASE" --repository_cache=)
    ;;
  *) echo "SETUP FAILED: TARGET must be genrule, cc or archive"; exit 2 ;;
esac
# CLIENT_CONFIG: the user's own .bazelrc lines (README.md "Bazel", a --bazelrc) instead of these two.
if [ -z "${CLIENT_CONFIG:-}" ]; then
  FLAGS+=(--remote_cache="$BASE")
  [ -n "${TOKEN:-}" ] && FLAGS+=(--remote_header="Authorization=Bearer ${TOKEN}")
fi
[ -n "${INSTANCE:-}" ] && FLAGS+=(--remote_instance_name="$INSTANCE")
run() {  # $1 = run number
  bz "$1" 120 build "$TGT" "${FLAGS[@]}" > "$W/run$1.log" 2>&1
}
summary() { grep -m1 -E '[0-9]+ process(es)?:' "$W/run$1.log"; }
# Bazel's warnings about the remote cache (a refused upload prints "Writing to Remote Cache").
cache_warnings() { grep -h -E 'Remote Cache|remote cache.*(not|fail)' "$W"/run*.log | head -5 | sed 's/^/bazel: /'; }

run 1; rc1=$?
echo "run1 rc=$rc1: $(summary 1)"
[ $rc1 = 0 ] && [ -s "$OUT" ] || {
  echo "SETUP FAILED: first bazel run failed"; grep -v linux-sandbox "$W/run1.log" | tail -20; exit 2; }
cp "$OUT" "$W/first.out"
# Stop run 1's server; run 2 uses a fresh output_base, i.e. no local action cache, outputs or server.
if [ -n "${ORIGIN_PID:-}" ]; then  # archive: the origin goes away, and run 1's output base with it
  kill "$ORIGIN_PID" && wait "$ORIGIN_PID" 2>/dev/null; ORIGIN_PID=
  bz 1 60 clean --expunge >/dev/null 2>&1 || { echo "SETUP FAILED: bazel clean --expunge"; exit 2; }
  echo "origin stopped, run 1 cleaned (--expunge)"
else
  bz 1 20 shutdown >/dev/null 2>&1
fi
run 2; rc2=$?
echo "run2 rc=$rc2: $(summary 2)"
if [ $rc2 = 0 ] && grep -qE '[0-9]+ remote cache hit' "$W/run2.log" && cmp -s "$OUT" "$W/first.out"; then
  if [ "${TARGET:-genrule}" = cc ]; then
    ran="$("$OUT")" && echo "hello ran: $ran" || { echo "NO REMOTE HIT: the cached binary does not run"; exit 1; }
  fi
  cache_warnings
  echo "REMOTE HIT (bazel $(dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null), ${TARGET:-genrule})"; exit 0
fi
cache_warnings
echo "NO REMOTE HIT"; grep -v linux-sandbox "$W/run2.log" | tail -15; exit 1
