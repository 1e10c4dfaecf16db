#!/bin/sh
# Roll a change of kura's pod template (a new image, a setting) through the StatefulSet one pod
# at a time, and move on only once the mesh has caught up with the pod that changed
# (docs/upgrading.md, "The rollout").
#
#   kubectl apply -k deploy/          # or your overlay; the StatefulSet's partition (3) holds it
#   deploy/kura/rollout.sh            # then this moves it, highest ordinal first
#
# The gate, `kura admin rollout-gate`, runs here, on the machine running this script (GATE: a
# kura 0.2.0 or later), never inside a pod: a pod of kura 0.1.0 has no such command, and the
# gate must judge pods of either version (on the first upgrade from 0.1.0 and on a roll back to
# it). It reads each pod's /ready and /status over `kubectl port-forward` (REACH=port-forward,
# local ports LOCAL_PORT_BASE + ordinal) or the pods' Service names (REACH=direct, when this runs
# inside the cluster). With auth on, give it a read token in KURA_TOKEN.
#
# First the gate checks the mesh is in step before anything moves (on the highest ordinal the
# run starts from). Then per ordinal N, from where the partition stands (replicas - 1 after
# `kubectl apply`, which sets it to replicas; N again on a resumed run) down to 0: lower the
# partition to N (the StatefulSet controller recreates pod kura-N from the new template), wait
# until kura-N runs the new revision and is Ready (/ready 200: discovery, bootstrap), then run
# the gate: it waits until kura-N holds no queued message for any peer and no peer holds one for
# it. A gate that fails stops the rollout with its reasons and a non-zero exit, the partition
# left at N: pods below N still run the old template. Fix the cause and run the script again (it
# resumes at N and never raises the partition, so no pod already moved is recreated from the old
# template), or roll back: apply the old template (its partition holds it) and run the script
# again, which rolls the old template through the same way, gated by the same local kura
# (docs/upgrading.md says which versions may run side by side).
#
# Environment: NAMESPACE (kura), STATEFULSET (kura), PEERS_SERVICE (kura-peers, the headless
# Service naming each pod), PORT (4000, the public port), SCHEME (http; https when the public
# port serves TLS: use REACH=direct then, or a certificate naming 127.0.0.1), GATE (kura admin
# rollout-gate), REACH (port-forward or direct), LOCAL_PORT_BASE (14000), GATE_WAIT_SECONDS
# (900, for each pod's readiness and for its gate), GATE_MAX_QUEUED (0: outbox messages a live
# write load may keep in flight; raise it when writes never pause), CLUSTER_DOMAIN
# (cluster.local). Needs kubectl with get/patch on the StatefulSet and get/port-forward on its
# pods. POSIX sh.
set -eu

NAMESPACE=${NAMESPACE:-kura}
STATEFULSET=${STATEFULSET:-kura}
PEERS_SERVICE=${PEERS_SERVICE:-kura-peers}
PORT=${PORT:-4000}
GATE_WAIT_SECONDS=${GATE_WAIT_SECONDS:-900}
GATE_MAX_QUEUED=${GATE_MAX_QUEUED:-0}
CLUSTER_DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
SCHEME=${SCHEME:-http}
GATE=${GATE:-kura admin rollout-gate}
REACH=${REACH:-port-forward}
LOCAL_PORT_BASE=${LOCAL_PORT_BASE:-14000}

say() { printf 'rollout: %s\n' "$*"; }
die() { printf 'rollout: ERROR: %s\n' "$*" >&2; exit 1; }
kc() { kubectl -n "$NAMESPACE" "$@"; }
sts() { kc get statefulset "$STATEFULSET" -o "jsonpath=$1"; }

# The controller has seen the applied template: its updateRevision names it.
waited=0
until [ "$(sts '{.status.observedGeneration}')" = "$(sts '{.metadata.generation}')" ]; do
  [ "$waited" -lt 60 ] || die "the StatefulSet controller has not observed $STATEFULSET's last change"
  sleep 1
  waited=$((waited + 1))
done
replicas=$(sts '{.spec.replicas}')
target=$(sts '{.status.updateRevision}')
[ -n "$replicas" ] && [ -n "$target" ] || die "cannot read $STATEFULSET in namespace $NAMESPACE"

case $REACH in
  port-forward | direct) ;;
  *) die "REACH must be port-forward or direct, not $REACH" ;;
esac
# shellcheck disable=SC2086 # GATE is a command line: split on purpose
$GATE --help >/dev/null 2>&1 ||
  die "the gate does not run here ($GATE): install kura 0.2.0 or later, or set GATE"

# A pod's public URL as the gate reaches it.
url_of() {
  if [ "$REACH" = direct ]; then
    printf '%s://%s-%s.%s.%s.svc.%s:%s' "$SCHEME" "$STATEFULSET" "$1" "$PEERS_SERVICE" \
      "$NAMESPACE" "$CLUSTER_DOMAIN" "$PORT"
  else
    printf '%s://127.0.0.1:%s' "$SCHEME" "$((LOCAL_PORT_BASE + $1))"
  fi
}

# Every pod's public URL: the gate reads each one's /status.
mesh=""
i=0
while [ "$i" -lt "$replicas" ]; do
  mesh="${mesh:+$mesh,}$(url_of "$i")"
  i=$((i + 1))
done

# With REACH=port-forward, one forward per pod for the length of one gate (a pod recreated
# since ends its forward, so each gate makes its own); the gate retries until they answer.
forwards=""
stop_forwards() {
  for pid in $forwards; do kill "$pid" 2>/dev/null || true; done
  forwards=""
}
trap stop_forwards EXIT
trap 'stop_forwards; exit 130' INT TERM

gate() {
  if [ "$REACH" = port-forward ]; then
    i=0
    while [ "$i" -lt "$replicas" ]; do
      kc port-forward "pod/$STATEFULSET-$i" "$((LOCAL_PORT_BASE + i)):$PORT" >/dev/null 2>&1 &
      forwards="$forwards $!"
      i=$((i + 1))
    done
  fi
  rc=0
  # shellcheck disable=SC2086
  $GATE --url "$(url_of "$1")" \
    --mesh-url "$mesh" --wait "$GATE_WAIT_SECONDS" --max-queued "$GATE_MAX_QUEUED" || rc=$?
  stop_forwards
  return "$rc"
}

# Resume where the partition stands: never raise it, or a pod already on the new revision that
# restarts with an ordinal below the raised partition is recreated from the old template.
partition=$(sts '{.spec.updateStrategy.rollingUpdate.partition}')
partition=${partition:-0}
last=$((replicas - 1))
[ "$partition" -lt "$replicas" ] && last=$partition
i=$((last + 1))
while [ "$i" -lt "$replicas" ]; do
  [ "$(kc get pod "$STATEFULSET-$i" -o 'jsonpath={.metadata.labels.controller-revision-hash}' \
    2>/dev/null || true)" = "$target" ] ||
    die "$STATEFULSET-$i is above the partition ($partition) but not on revision $target"
  i=$((i + 1))
done
say "$STATEFULSET: pods $last..0 to revision $target (partition $partition); checking the mesh is in step first"
gate "$last" || die "the mesh is not in step before the rollout: nothing was changed"

ordinal=$last
while [ "$ordinal" -ge 0 ]; do
  pod="$STATEFULSET-$ordinal"
  say "partition $ordinal: $pod to revision $target"
  kc patch statefulset "$STATEFULSET" --type merge \
    -p "{\"spec\":{\"updateStrategy\":{\"rollingUpdate\":{\"partition\":$ordinal}}}}" >/dev/null
  waited=0
  until [ "$(kc get pod "$pod" -o 'jsonpath={.metadata.labels.controller-revision-hash}' \
    2>/dev/null || true)" = "$target" ]; do
    [ "$waited" -lt "$GATE_WAIT_SECONDS" ] || die "$pod did not move to revision $target"
    sleep 2
    waited=$((waited + 2))
  done
  kc wait --for=condition=Ready "pod/$pod" --timeout="${GATE_WAIT_SECONDS}s" >/dev/null ||
    die "$pod is not Ready: partition left at $ordinal (kubectl -n $NAMESPACE describe pod $pod)"
  say "$pod is Ready; waiting for the mesh to catch up with it"
  gate "$ordinal" || die "the mesh did not catch up with $pod: partition left at $ordinal"
  ordinal=$((ordinal - 1))
done
say "done: every pod of $STATEFULSET runs revision $target and the mesh is in step"
