#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, for fanin's node test (e2e/kubenode_test.go) and
# for trying deploy/kubernetes by hand (docs/lab/kubernetes.md "A node on this machine").
#
#   scripts/kube-node.sh up      start it; prints the lines to source (KUBECONFIG, FANIN_NODE_IMAGE)
#   scripts/kube-node.sh down    stop it and remove everything it made (processes, mounts, network)
#   scripts/kube-node.sh status  what runs
#
# Root only. Everything runs as a process of this script's, on the host:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (nftables
#   mode), CoreDNS (tools/kube/coredns, on the node's address; the kubelet gives pods that address
#   as their DNS server) from scripts/kube.sh --node; containerd and runc from Debian (apt); the
#   bridge, host-local and loopback CNI plugins from Debian's containernetworking-plugins.
# The node's address is 10.89.0.1 on an interface fanin0 (a bridge without ports), pods get 10.88.0.0/16 on the bridge
# fanin-cni0, Services 10.96.0.0/16. Nothing outside these is touched: not the default route, not
# /etc/resolv.conf. The kubelet's kernel settings (vm.overcommit_memory, kernel.panic, ...) and
# net.ipv4.ip_forward and net.bridge.bridge-nf-call-iptables are saved and restored by down.
# The storage class fanin-node-local (the default) binds claims to hostPath volumes under the node's
# directory, pre-made (8 of them), which keep their data across pod restarts.
# Images: no registry is reachable, so up builds fanin's image (cmd/fanin-image) and the sandbox's
# pause image (tools/kube/pause), and imports them into containerd; FANIN_NODE_IMAGE is the
# reference of fanin's, tagged by its digest.
#
# State, logs and configuration live in $FANIN_NODE_DIR (default /tmp/fanin-node); the logs stay
# after down, in $FANIN_NODE_DIR/logs.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${FANIN_NODE_DIR:-/tmp/fanin-node}"
node=fanin-node
ip=10.89.0.1
podnet=10.88.0.0/16
svcnet=10.96.0.0/16
apiport=16443
etcdport=12379
dummy=fanin0
bridge=fanin-cni0
run="$dir/run"
logs="$dir/logs"
sock="$run/containerd.sock"
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables"

say() { echo "kube-node: $*" >&2; }
die() { say "$*"; exit 1; }
elapsed() { echo $(($(date +%s) - t0))s; }

# start NAME CMD...: runs CMD in the background, its output in logs/NAME.log, its pid in run/NAME.pid.
start() {
  local name=$1
  shift
  setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

# wait_for WHAT SECONDS CMD...: retries CMD every half second.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "$what not ready after ${secs}s (logs in $logs)"
}

alive() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

kubeconfig() { # kubeconfig FILE TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: $node
    cluster: {server: "https://$ip:$apiport", certificate-authority: "$dir/pki/ca.crt"}
users:
  - name: user
    user: {token: "$2"}
contexts:
  - name: $node
    context: {cluster: $node, user: user}
current-context: $node
EOF
}

certs() {
  local p="$dir/pki"
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=fanin-node-ca" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$p/apiserver.key" \
    -out "$p/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\n' "$ip" >"$p/san.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 7 -extfile "$p/san.ext" -out "$p/apiserver.crt" 2>/dev/null
  # The apiserver's client certificate for the kubelet's API (logs, exec), which the kubelet
  # checks against the CA and authorizes by asking the apiserver (webhook).
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$p/kubelet-client.key" -out "$p/kubelet-client.csr" 2>/dev/null
  openssl x509 -req -in "$p/kubelet-client.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 7 -out "$p/kubelet-client.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  # Static tokens: user,uid,groups. Each component is its own user with the default RBAC roles the
  # apiserver makes for it; the kubelet is a node (Node authorizer).
  : >"$p/tokens.csv"
  chmod 600 "$p/tokens.csv"
  local who
  for who in "admin,admin,system:masters" "kubelet,system:node:$node,system:nodes" \
    "scheduler,system:kube-scheduler," "controller-manager,system:kube-controller-manager," \
    "proxy,system:kube-proxy," "coredns,fanin-node-coredns,"; do
    local file=${who%%,*} rest=${who#*,}
    local user=${rest%%,*} groups=${rest#*,}
    local tok
    tok=$(openssl rand -hex 24)
    echo "$tok,$user,$user,\"$groups\"" >>"$p/tokens.csv"
    kubeconfig "$dir/$file.kubeconfig" "$tok"
  done
}

configs() {
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam" "$dir/containerd" "$dir/kubelet"
  cat >"$dir/cni/net.d/10-fanin-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "fanin-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$podnet", "gateway": "10.88.0.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.grpc.v1.introspection.tracing"]
[grpc]
  address = "$sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/fanin-pause:node"
  disable_apparmor = true
  # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below
  # its parent's; the kubelet asks -998 for sandboxes and runc fails ("can't get final child's PID
  # from pipe"). Restricted, containerd raises such values to its own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$dir/cni/net.d"
EOF
  cat >"$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$dir/pki/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDNS: [$ip]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: "unix://$sock"
podLogsDir: "$dir/pod-logs"
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
EOF
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: "$dir/proxy.kubeconfig"}
hostnameOverride: $node
clusterCIDR: $podnet
nodePortAddresses: ["$ip/32"]
healthzBindAddress: "$ip:10256"
metricsBindAddress: "$ip:10249"
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
EOF
  cat >"$dir/Corefile" <<EOF
.:53 {
    bind $ip
    errors
    ready $ip:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    forward . /etc/resolv.conf
}
EOF
}

# cluster_objects makes what a cluster's installer would: CoreDNS's read access, and the storage
# class with its volumes.
cluster_objects() {
  mkdir -p "$dir/volumes"
  {
    cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "fanin-node:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "fanin-node:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "fanin-node:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: fanin-node-coredns}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fanin-node-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
    local i
    for i in 0 1 2 3 4 5 6 7; do
      # The image runs as 65532 (nonroot); a hostPath volume keeps the directory's owner.
      mkdir -p "$dir/volumes/pv$i"
      chown 65532:65532 "$dir/volumes/pv$i"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: fanin-node-pv$i}
spec:
  storageClassName: fanin-node-local
  capacity: {storage: 100Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: "$dir/volumes/pv$i", type: Directory}
EOF
    done
  } | "$K/kubectl" --kubeconfig "$dir/admin.kubeconfig" apply -f - >/dev/null
}

# images builds fanin's image and the pause image and imports both into containerd's k8s.io
# namespace, where the kubelet finds them (imagePullPolicy IfNotPresent: a tag that is present is not
# pulled).
images() {
  local t=$(date +%s) d
  mkdir -p "$dir/images"
  (cd "$root" && nice -n "${FANIN_NICE:-10}" go run ./cmd/fanin-image --binary "$K/pause" \
    --out "$dir/images/pause.tar" --tag fanin-pause:node --version node) >"$logs/image-pause.log" 2>&1 ||
    die "pause image: $(tail -3 "$logs/image-pause.log")"
  d=$(cd "$root" && nice -n "${FANIN_NICE:-10}" go run ./cmd/fanin-image --platform "linux/$(go env GOARCH)" \
    --out "$dir/images/fanin.tar" --tag fanin:build 2>"$logs/image-fanin.log") ||
    die "fanin image: $(tail -3 "$logs/image-fanin.log")"
  local ctr=(ctr --address "$sock" -n k8s.io)
  "${ctr[@]}" images import "$dir/images/pause.tar" >/dev/null
  "${ctr[@]}" images import "$dir/images/fanin.tar" >/dev/null
  # Tagged by its digest: a new build is a new tag, which no running pod refers to.
  d=${d#sha256:}
  image="docker.io/library/fanin:sha-${d:0:16}"
  "${ctr[@]}" images tag --force docker.io/library/fanin:build "$image" >/dev/null
  echo "$image" >"$dir/image"
  say "images built and imported in $(($(date +%s) - t))s: $image"
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (containerd, runc, network namespaces)"
  if alive kubelet || alive kube-apiserver; then die "already up (scripts/kube-node.sh down first)"; fi
  local miss="" b
  for b in containerd runc ctr nft openssl; do command -v $b >/dev/null || miss="$miss $b"; done
  cni_bin=/usr/lib/cni
  [ -x "$cni_bin/bridge" ] || miss="$miss containernetworking-plugins"
  [ -z "$miss" ] || die "missing:$miss (Debian: apt-get install containerd runc containernetworking-plugins nftables openssl)"
  t0=$(date +%s)
  K=$("$root/scripts/kube.sh" --node)
  say "binaries in $K ($(elapsed))"
  [ -z "$(awk -v d="$dir" 'index($2, d) == 1' /proc/self/mounts)" ] ||
    die "mounts under $dir are left from an earlier run: scripts/kube-node.sh down first"
  rm -rf "$dir"
  mkdir -p "$dir" "$run" "$logs"
  # Save the kernel settings the kubelet and the network change, for down.
  : >"$dir/sysctl.saved"
  for b in $sysctls; do
    echo "$b=$(sysctl -n "$b" 2>/dev/null || echo)" >>"$dir/sysctl.saved"
  done
  ls /run/netns 2>/dev/null | sort >"$dir/netns.before" || true
  mountpoint -q /run/netns && touch "$dir/netns.mounted" || true
  nft list tables 2>/dev/null | sort >"$dir/nft.before" || true
  certs
  configs

  ip link add "$dummy" type bridge # a bridge without ports: this kernel has no dummy interfaces
  ip addr add "$ip/32" dev "$dummy"
  ip link set "$dummy" up
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

  start etcd "$K/etcd" --name "$node" --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcdport" --advertise-client-urls "http://127.0.0.1:$etcdport" \
    --listen-peer-urls "http://127.0.0.1:$((etcdport + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcdport + 1))" \
    --initial-cluster "$node=http://127.0.0.1:$((etcdport + 1))" --unsafe-no-fsync --log-level warn
  start kube-apiserver "$K/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcdport" \
    --bind-address "$ip" --advertise-address "$ip" --secure-port "$apiport" \
    --tls-cert-file "$dir/pki/apiserver.crt" --tls-private-key-file "$dir/pki/apiserver.key" \
    --client-ca-file "$dir/pki/ca.crt" --token-auth-file "$dir/pki/tokens.csv" --anonymous-auth=false \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$dir/pki/sa.key" \
    --service-account-signing-key-file "$dir/pki/sa.key" --service-cluster-ip-range "$svcnet" \
    --kubelet-client-certificate "$dir/pki/kubelet-client.crt" --kubelet-client-key "$dir/pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --cert-dir "$dir/pki/apiserver-certs" --enable-priority-and-fairness=false
  start containerd containerd --config "$dir/containerd/config.toml"
  local kc=("$K/kubectl" --kubeconfig "$dir/admin.kubeconfig")
  wait_for "kube-apiserver" 120 "${kc[@]}" get --raw /readyz
  say "apiserver ready ($(elapsed))"
  start kube-controller-manager "$K/kube-controller-manager" --kubeconfig "$dir/controller-manager.kubeconfig" \
    --use-service-account-credentials --service-account-private-key-file "$dir/pki/sa.key" \
    --root-ca-file "$dir/pki/ca.crt" --leader-elect=false --secure-port 0 --cluster-name "$node"
  start kube-scheduler "$K/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" --leader-elect=false --secure-port 0
  cluster_objects
  start coredns "$K/coredns" -conf "$dir/Corefile"
  wait_for containerd 60 ctr --address "$sock" version
  images
  start kubelet "$K/kubelet" --config "$dir/kubelet/config.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
    --root-dir "$dir/kubelet" --hostname-override "$node" --node-ip "$ip"
  start kube-proxy "$K/kube-proxy" --config "$dir/kube-proxy.yaml"
  wait_for "node $node Ready" 120 "${kc[@]}" wait --for=condition=Ready "node/$node" --timeout=1s
  wait_for CoreDNS 60 curl -sf "http://$ip:8181/ready"
  say "up in $(elapsed): node $node Ready"
  env_lines
}

env_lines() {
  echo "export KUBECONFIG=$dir/admin.kubeconfig"
  echo "export FANIN_NODE_IMAGE=$(cat "$dir/image")"
  echo "export FANIN_KUBE=$("$root/scripts/kube.sh" --node)"
}

stop_pid() { # stop_pid NAME SECONDS: SIGTERM, then SIGKILL after SECONDS
  local f="$run/$1.pid" pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < $2 * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { say "$1 ($pid) did not stop: killed"; kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$f"
}

down() {
  [ -d "$dir" ] || { say "nothing to stop ($dir does not exist)"; return 0; }
  t0=$(date +%s)
  K=$("$root/scripts/kube.sh" --node 2>/dev/null || true)
  local kc=("$K/kubectl" --kubeconfig "$dir/admin.kubeconfig" --request-timeout 10s)
  # Pods first, through the kubelet (their SIGTERM, their network torn down by CNI): the
  # controllers stop first so that nothing replaces them.
  stop_pid kube-controller-manager 10
  stop_pid kube-scheduler 10
  if alive kubelet && alive kube-apiserver; then
    "${kc[@]}" delete pods --all --all-namespaces --grace-period 5 --wait=false >/dev/null 2>&1 || true
    local i
    for ((i = 0; i < 120; i++)); do
      [ -z "$("${kc[@]}" get pods -A -o name 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop_pid kubelet 10
  stop_pid kube-proxy 10
  stop_pid coredns 5
  # Whatever the kubelet left: containers' tasks and the sandboxes' shims, by the pids containerd
  # gives (only this containerd's: it has its own socket).
  if alive containerd; then
    local ctr=(ctr --address "$sock" -n k8s.io) c
    for c in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
      "${ctr[@]}" tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
    sleep 1
    for c in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$c" >/dev/null 2>&1 || true; done
    for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd 10
  # containerd's shims outlive it; they are this containerd's when their -address is its socket.
  local pid
  for pid in $(pgrep -f -- "-address $sock" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  stop_pid kube-apiserver 10
  stop_pid etcd 10
  # Network namespaces the CNI made and CRI did not remove (a pod the kubelet did not stop).
  local ns
  for ns in $(comm -13 "$dir/netns.before" <(ls /run/netns 2>/dev/null | sort) 2>/dev/null); do
    case "$ns" in cni-*) ip netns delete "$ns" 2>/dev/null || true ;; esac
  done
  # /run/netns becomes a mount point of its own (made shared, as ip netns does) once network
  # namespaces are made there; unmounted if it was none before and holds none now.
  if [ ! -e "$dir/netns.mounted" ] && mountpoint -q /run/netns && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true
  fi
  # Mounts under the node's directory (the containers' root file systems, the pods' volumes),
  # deepest first.
  local m
  for m in $(awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # The kubelet links each container's log into /var/log/containers (a fixed path).
  find /var/log/containers -maxdepth 1 -lname "$dir/*" -delete 2>/dev/null || true
  ip link del "$bridge" 2>/dev/null || true
  ip link del "$dummy" 2>/dev/null || true
  nft delete table ip kube-proxy 2>/dev/null || true
  nft delete table ip6 kube-proxy 2>/dev/null || true
  # The kubelet's iptables chains: KUBE-FIREWALL (drops outside packets to 127.0.0.0/8) and canaries.
  local ipt t
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || continue
    for t in INPUT OUTPUT; do $ipt -t filter -D $t -j KUBE-FIREWALL 2>/dev/null || true; done
    $ipt -t filter -F KUBE-FIREWALL 2>/dev/null || true
    $ipt -t filter -X KUBE-FIREWALL 2>/dev/null || true
    for t in filter mangle nat; do $ipt -t $t -X KUBE-KUBELET-CANARY 2>/dev/null || true; done
    $ipt -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true
  done
  # The tables iptables made for them, if they were not there before and hold no rule now.
  while read -r t; do
    [ -n "$t" ] || continue
    if ! nft list $t 2>/dev/null | grep -qvE '^\s*(table |chain |type |policy |}|$)'; then
      nft delete $t 2>/dev/null || true
    fi
  done < <(comm -13 "$dir/nft.before" <(nft list tables 2>/dev/null | sort) 2>/dev/null)
  # The pods' cgroups (cgroupfs driver): kubepods under each controller, deepest first.
  local cg
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [ -f "$dir/sysctl.saved" ]; then
    local kv
    while read -r kv; do
      [ -n "${kv#*=}" ] && sysctl -qw "$kv" 2>/dev/null || true
    done <"$dir/sysctl.saved"
  fi
  # Keep the logs; remove the rest (etcd, images, volumes, the kubelet's directory).
  find "$dir" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} + 2>/dev/null || true
  leftovers
  say "down in $(elapsed); logs in $logs"
}

# leftovers reports what down could not remove.
leftovers() {
  local bad=""
  [ -z "$(awk -v d="$dir" 'index($2, d) == 1' /proc/self/mounts)" ] || bad="$bad mounts under $dir;"
  ip link show "$bridge" >/dev/null 2>&1 && bad="$bad bridge $bridge;"
  ip link show "$dummy" >/dev/null 2>&1 && bad="$bad interface $dummy;"
  [ -z "$(pgrep -f -- "$dir/" || true)" ] || bad="$bad processes $(pgrep -f -- "$dir/" | tr '\n' ' ');"
  nft list table ip kube-proxy >/dev/null 2>&1 && bad="$bad nft table kube-proxy;"
  iptables -S 2>/dev/null | grep -q KUBE- && bad="$bad iptables KUBE- chains;"
  ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && bad="$bad cgroups kubepods;"
  if [ -n "$bad" ]; then say "left behind:$bad"; return 1; fi
}

status() {
  local n
  for n in etcd kube-apiserver containerd kube-controller-manager kube-scheduler coredns kubelet kube-proxy; do
    if alive $n; then echo "$n running ($(cat "$run/$n.pid"))"; else echo "$n stopped"; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: scripts/kube-node.sh up|down|status|env" >&2; exit 2 ;;
esac
