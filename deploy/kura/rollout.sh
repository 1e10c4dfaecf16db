#!/bin/sh
# Roll a change of kura's pod template (a new image, a setting) through the StatefulSet one pod
# at a time, and move on only once the mesh has caught up with the pod that changed
# (docs/upgrading.md, "The rollout").
#
#   kubectl apply -k deploy/          # or your overlay; the StatefulSet's partition (3) holds it
#   deploy/kura/rollout.sh            # then this moves it, highest ordinal first
#
# Per ordinal N, from the highest to 0: lower the partition to N (the StatefulSet controller
# recreates pod kura-N from the new template), wait until kura-N runs the new revision and is
# Ready (/ready 200: discovery, bootstrap), then run `kura admin rollout-gate` inside it: it
# waits until kura-N holds no queued message for any peer and no peer holds one for it. A gate
# that fails stops the rollout with its reasons and a non-zero exit, the partition left at N:
# pods below N still run the old template. Fix the cause and run the script again (it resumes;
# pods already on the new revision pass at once), or roll back: apply the old template and run
# it again (docs/upgrading.md says which versions may run side by side).
#
# Environment: NAMESPACE (kura), STATEFULSET (kura), PEERS_SERVICE (kura-peers, the headless
# Service naming each pod), PORT (4000, the public port), GATE_WAIT_SECONDS (900, for each pod's
# readiness and for its gate), GATE_MAX_QUEUED (0: outbox messages a live write load may keep
# in flight; raise it when writes never pause), CLUSTER_DOMAIN (cluster.local). Needs kubectl
# with get/patch on the StatefulSet and get/exec on its pods. POSIX sh.
set -eu

NAMESPACE=${NAMESPACE:-kura}
STATEFULSET=${STATEFULSET:-kura}
PEERS_SERVICE=${PEERS_SERVICE:-kura-peers}
PORT=${PORT:-4000}
GATE_WAIT_SECONDS=${GATE_WAIT_SECONDS:-900}
GATE_MAX_QUEUED=${GATE_MAX_QUEUED:-0}
CLUSTER_DOMAIN=${CLUSTER_DOMAIN:-cluster.local}

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

# Every pod's public URL: the gate reads each one's /status.
mesh=""
i=0
while [ "$i" -lt "$replicas" ]; do
  mesh="${mesh:+$mesh,}http://$STATEFULSET-$i.$PEERS_SERVICE.$NAMESPACE.svc.$CLUSTER_DOMAIN:$PORT"
  i=$((i + 1))
done

gate() {
  kc exec "$1" -c kura -- kura admin rollout-gate --url "http://127.0.0.1:$PORT" \
    --mesh-url "$mesh" --wait "$GATE_WAIT_SECONDS" --max-queued "$GATE_MAX_QUEUED"
}

last=$((replicas - 1))
say "$STATEFULSET: $replicas pods to revision $target; checking the mesh is in step first"
gate "$STATEFULSET-$last" || die "the mesh is not in step before the rollout: nothing was changed"

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
  gate "$pod" || die "the mesh did not catch up with $pod: partition left at $ordinal"
  ordinal=$((ordinal - 1))
done
say "done: every pod of $STATEFULSET runs revision $target and the mesh is in step"
