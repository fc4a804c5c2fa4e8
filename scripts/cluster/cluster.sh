#!/usr/bin/env bash
# The local single-node Kubernetes cluster of metax.gpu (tests, CI, demo):
# etcd, kube-apiserver, kube-controller-manager and kubelet as processes, a
# static-pod kube-scheduler from /etc/kubernetes/manifests, containerd + runc,
# bridge CNI, two registries (plain HTTP and htpasswd+TLS) and a simulated
# MetaX node root. Everything listens on loopback.
#
# Usage: cluster.sh up | down | status | env | json | podman-env
#   up      idempotent; builds/installs what is missing first
#   down    stops only what `up` started (PID files), unmounts, removes what it
#           added (files, CNI, iptables chains, cgroups); always safe to run
#   status  components, kubeconfig, registries, node; exit 0 when all run
#   env     shell exports for using the cluster: eval "$(cluster.sh env)"
#   json    the same as JSON (used by tests/integration/conftest.py)
#   podman-env  CONTAINERS_CONF/CONTAINERS_REGISTRIES_CONF exports (no cluster needed)
# See docs/local-cluster.md.
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

STATE=${METAX_CLUSTER_DIR}
RUN=${METAX_RUN_DIR:-/run/metax-gpu-cluster}
ETC=${METAX_KUBE_ETC}
PKI=${ETC}/pki
MANIFESTS=${ETC}/manifests
KUBELET_DIR=${METAX_KUBELET_DIR}
LOGS=${STATE}/logs
PIDS=${STATE}/pids
BASELINE=${STATE}/baseline
MARKER_NAME=.metax-gpu-cluster
ADMIN_CONF=${ETC}/admin.conf
CONTAINERD_SOCK=${RUN}/containerd/containerd.sock
SERVICE_CIDR=10.96.0.0/12
SERVICE_IP=10.96.0.1
POD_CIDR=10.244.0.0/24
POD_GW=10.244.0.1
BRIDGE=metax-cni0
CNI_NAME=metax-gpu-cluster
CHAIN=METAX-GPU-CLUSTER
CHAIN_FWD=METAX-GPU-CLUSTER-FWD
SCHED_PORT=10259
KCM_PORT=10257
KUBELET_HEALTHZ_PORT=10248
APISERVER=https://127.0.0.1:${METAX_APISERVER_PORT}
# Host paths the cluster creates and `down` removes unless they pre-existed.
TRACKED_PATHS=("${ETC}" "${KUBELET_DIR}" /var/log/pods /var/log/containers /var/lib/cni
  "$(dirname "${METAX_SIM_ROOT}")" "${RUN}" /run/netns /run/containerd)

BIN=$(k8s_bin_dir)
kubectl() { "${BIN}/kubectl" --kubeconfig "${ADMIN_CONF}" "$@"; }
ctr_k8s() { ctr --address "${CONTAINERD_SOCK}" -n k8s.io "$@"; }

# ------------------------------------------------------------------ helpers
node_name() {
  if [[ -f ${STATE}/node-name ]]; then
    cat "${STATE}/node-name"
    return
  fi
  if [[ -n ${METAX_NODE_NAME:-} ]]; then
    echo "${METAX_NODE_NAME}"
    return
  fi
  # The kubelet listens on 127.0.0.1 only and the apiserver reaches it by the
  # node name (Hostname first), so the name must resolve to 127.0.0.1: the
  # machine's hostname when it does (Debian VMs list it in /etc/hosts), else
  # "localhost". Nothing is added to /etc/hosts.
  local h
  h=$(hostname | tr '[:upper:]' '[:lower:]')
  if [[ $(getent ahostsv4 "${h}" 2>/dev/null | awk '{print $1}' | sort -u) == 127.0.0.1 ]]; then
    echo "${h}"
  else
    echo localhost
  fi
}

pid_of() { [[ -f ${PIDS}/$1.pid ]] && cat "${PIDS}/$1.pid"; }

# running NAME: its PID file names a live process running the recorded binary.
running() {
  local pid exe want
  pid=$(pid_of "$1" 2>/dev/null) || return 1
  [[ -n ${pid} && -d /proc/${pid} ]] || return 1
  want=$(cat "${PIDS}/$1.exe" 2>/dev/null) || return 1
  exe=$(readlink "/proc/${pid}/exe" 2>/dev/null) || return 1
  [[ ${exe% (deleted)} == "${want}" ]]
}

# start NAME BINARY ARGS...: detached (own session), output to LOGS/NAME.log.
# A running NAME is kept unless its command line or one of the files listed in
# START_CONFIG (space-separated) changed since it was started: then restarted.
start() {
  local name=$1 bin=$2 hash f
  shift 2
  hash=$({
    printf '%s\n' "${bin}" "$@"
    for f in ${START_CONFIG:-}; do cat "${f}"; done
  } | sha256sum | cut -d' ' -f1)
  if running "${name}"; then
    if [[ $(cat "${PIDS}/${name}.hash" 2>/dev/null) == "${hash}" ]]; then
      log "${name} already running (pid $(pid_of "${name}"))"
      return 0
    fi
    log "${name}: configuration changed; restarting it"
    stop "${name}"
  fi
  if [[ -f ${PIDS}/${name}.pid ]]; then
    warn "stale PID file for ${name} (pid $(pid_of "${name}") is not running ${bin}); removing it"
    rm -f "${PIDS}/${name}.pid" "${PIDS}/${name}.exe"
  fi
  bin=$(readlink -f "${bin}")
  printf '\n==== %s start %s\n' "$(date -Is)" "${name}" >>"${LOGS}/${name}.log"
  # fd 8 is cluster.lock: the daemon must not inherit (and hold) it
  setsid "${bin}" "$@" </dev/null >>"${LOGS}/${name}.log" 2>&1 8>&- &
  echo $! >"${PIDS}/${name}.pid"
  echo "${bin}" >"${PIDS}/${name}.exe"
  echo "${hash}" >"${PIDS}/${name}.hash"
  log "${name} started (pid $!, log ${LOGS}/${name}.log)"
}

# stop NAME: TERM, then KILL after a grace period; only the recorded PID.
stop() {
  local name=$1 pid i
  [[ -f ${PIDS}/${name}.pid ]] || return 0
  pid=$(pid_of "${name}")
  if running "${name}"; then
    kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      [[ -d /proc/${pid} ]] || break
      # a zombie (already exited, not yet reaped by PID 1) counts as stopped
      [[ $(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null) == Z ]] && break
      sleep 0.1
    done
    if [[ -d /proc/${pid} && $(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null) != Z ]]; then
      warn "${name} (pid ${pid}) did not stop on TERM; killing it"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.5
    fi
    log "stopped ${name} (pid ${pid})"
  else
    log "${name}: stale PID file (pid ${pid} not running it); removing"
  fi
  rm -f "${PIDS}/${name}.pid" "${PIDS}/${name}.exe" "${PIDS}/${name}.hash"
}

# wait_for DESC TIMEOUT LOGNAME CMD...: poll CMD until it succeeds.
wait_for() {
  local desc=$1 timeout=$2 logname=$3 t0
  shift 3
  t0=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    if (($(date +%s) - t0 >= timeout)); then
      if [[ -n ${logname} && -f ${LOGS}/${logname}.log ]]; then
        warn "last lines of ${LOGS}/${logname}.log:"
        tail -n 25 "${LOGS}/${logname}.log" >&2
      fi
      die "timed out after ${timeout}s waiting for ${desc}.
  Logs: ${LOGS}/. Run 'make cluster-down' (always safe) and then 'make cluster-up' again."
    fi
    if [[ -n ${logname} ]] && [[ -f ${PIDS}/${logname}.pid ]] && ! running "${logname}"; then
      warn "${logname} exited; last lines of ${LOGS}/${logname}.log:"
      tail -n 25 "${LOGS}/${logname}.log" >&2
      die "${logname} exited while waiting for ${desc}. Run 'make cluster-down', fix the cause, then 'make cluster-up'."
    fi
    sleep 0.5
  done
}

# check_port NAME PORT: free, or held by our NAME.
check_port() {
  local name=$1 port=$2 owner
  running "${name}" && return 0
  port_in_use "${port}" || return 0
  owner=$(port_owner "${port}")
  die "port 127.0.0.1:${port} (needed by ${name}) is already in use${owner:+ by ${owner}}.
  Stop that process (if it is a leftover of this cluster: 'make cluster-down'), or choose another
  port through the environment (see docs/local-cluster.md, e.g. METAX_APISERVER_PORT, METAX_REGISTRY_PORT)."
}

https_ok() { curl -fsS --max-time 3 --cacert "${PKI}/ca.crt" "$@"; }

# ------------------------------------------------------------------ baseline
# What the machine looked like before the first `up` of this cycle; `down`
# restores it. Never overwritten while it exists (a failed up/down keeps it).
record_baseline() {
  [[ -f ${BASELINE}/complete ]] && return 0
  mkdir -p "${BASELINE}"
  local p
  : >"${BASELINE}/existed"
  for p in "${TRACKED_PATHS[@]}"; do
    [[ -e ${p} ]] && echo "${p}" >>"${BASELINE}/existed"
  done
  if [[ -d ${ETC} ]]; then (cd "${ETC}" && find . -mindepth 1 | sort) >"${BASELINE}/etc-files"; else : >"${BASELINE}/etc-files"; fi
  if [[ -d ${KUBELET_DIR} ]]; then (cd "${KUBELET_DIR}" && find . -mindepth 1 | sort) >"${BASELINE}/kubelet-files"; else : >"${BASELINE}/kubelet-files"; fi
  find /sys/fs/cgroup -maxdepth 2 -name kubepods -type d 2>/dev/null | sort >"${BASELINE}/cgroups" || true
  find /run/netns -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort >"${BASELINE}/netns" || true
  for t in filter nat mangle raw; do
    iptables -t "${t}" -S 2>/dev/null | awk '$1 == "-N" {print $2}' | sed "s/^/${t} /" || true
    ip6tables -t "${t}" -S 2>/dev/null | awk '$1 == "-N" {print $2}' | sed "s/^/6${t} /" || true
  done >"${BASELINE}/chains"
  cat /proc/sys/net/ipv4/ip_forward >"${BASELINE}/ip_forward"
  touch "${BASELINE}/complete"
}

existed_before() { grep -qxF "$1" "${BASELINE}/existed" 2>/dev/null; }

# ------------------------------------------------------------------ preflight
preflight() {
  require_root
  local f foreign=()
  if [[ ! -f ${BASELINE}/complete && ! -f ${ETC}/${MARKER_NAME} ]]; then
    for f in admin.conf kubelet.conf scheduler.conf controller-manager.conf super-admin.conf pki/ca.crt; do
      [[ -e ${ETC}/${f} ]] && foreign+=("${ETC}/${f}")
    done
    if [[ -d ${MANIFESTS} ]]; then
      while IFS= read -r f; do foreign+=("${f}"); done < <(find "${MANIFESTS}" -mindepth 1 -maxdepth 1)
    fi
    [[ -e ${KUBELET_DIR}/config.yaml ]] && foreign+=("${KUBELET_DIR}/config.yaml")
    [[ -e ${KUBELET_DIR}/pki ]] && foreign+=("${KUBELET_DIR}/pki")
    if ((${#foreign[@]})); then
      die "this machine already holds files of another Kubernetes installation:
    ${foreign[*]}
  The local cluster uses the kubeadm paths ${ETC} and ${KUBELET_DIR} and will not touch a foreign
  cluster's files. Move them away (or run on another machine), then 'make cluster-up' again."
    fi
  fi
  local missing
  if ! missing=$("${CLUSTER_SCRIPTS}/packages.sh" --check); then
    die "${missing}. Run scripts/cluster/packages.sh (installs them with apt-get)."
  fi
  [[ -d /sys/fs/cgroup ]] || die "/sys/fs/cgroup is not mounted"
  check_port etcd "${METAX_ETCD_PORT}"
  check_port etcd "${METAX_ETCD_PEER_PORT}"
  check_port kube-apiserver "${METAX_APISERVER_PORT}"
  check_port kube-controller-manager "${KCM_PORT}"
  check_port registry "${METAX_REGISTRY_PORT}"
  check_port registry-auth "${METAX_REGISTRY_AUTH_PORT}"
  check_port kubelet "${METAX_KUBELET_PORT}"
  check_port kubelet "${KUBELET_HEALTHZ_PORT}"
  if ! running kubelet && port_in_use "${SCHED_PORT}"; then
    die "port 127.0.0.1:${SCHED_PORT} (kube-scheduler) is already in use by $(port_owner "${SCHED_PORT}").
  Stop that process (a leftover of this cluster: 'make cluster-down'), then 'make cluster-up' again."
  fi
}

# ------------------------------------------------------------------ PKI
# cert NAME CN O KIND [SANS]: EC P-256 key + certificate signed by the CA.
cert() {
  local name=$1 cn=$2 o=$3 kind=$4 sans=${5:-} subj ext
  [[ -s ${PKI}/${name}.crt && -s ${PKI}/${name}.key ]] && return 0
  subj="/CN=${cn}"
  [[ -n ${o} ]] && subj="/O=${o}${subj}"
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    case ${kind} in
      server) echo "extendedKeyUsage=serverAuth" ;;
      client) echo "extendedKeyUsage=clientAuth" ;;
      both) echo "extendedKeyUsage=serverAuth,clientAuth" ;;
    esac
    [[ -n ${sans} ]] && echo "subjectAltName=${sans}"
  } >"${ext}"
  openssl ecparam -name prime256v1 -genkey -noout -out "${PKI}/${name}.key" 2>/dev/null
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" \
    -CAcreateserial -days 3650 -extfile "${ext}" -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${ext}" "${PKI}/${name}.csr"
  chmod 600 "${PKI}/${name}.key"
}

kubeconfig() { # FILE USER CERTNAME
  local file=$1 user=$2 crt=$3
  [[ -s ${file} ]] && return 0
  umask 077
  cat >"${file}" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: kubernetes
    cluster:
      server: ${APISERVER}
      certificate-authority-data: $(base64 -w0 <"${PKI}/ca.crt")
users:
  - name: ${user}
    user:
      client-certificate-data: $(base64 -w0 <"${PKI}/${crt}.crt")
      client-key-data: $(base64 -w0 <"${PKI}/${crt}.key")
contexts:
  - name: ${user}@kubernetes
    context:
      cluster: kubernetes
      user: ${user}
current-context: ${user}@kubernetes
EOF
  umask 022
}

make_pki() {
  local node=$1
  mkdir -p "${PKI}" "${MANIFESTS}"
  echo "${STATE}" >"${ETC}/${MARKER_NAME}"
  if [[ ! -s ${PKI}/ca.crt ]]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "${PKI}/ca.key" 2>/dev/null
    chmod 600 "${PKI}/ca.key"
    openssl req -x509 -new -key "${PKI}/ca.key" -subj "/CN=kubernetes" -days 3650 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "${PKI}/ca.crt" 2>/dev/null
  fi
  cert apiserver kube-apiserver "" server \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:${node},IP:127.0.0.1,IP:${SERVICE_IP}"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters client
  cert admin kubernetes-admin system:masters client
  cert controller-manager system:kube-controller-manager "" client
  cert scheduler system:kube-scheduler "" client
  cert kubelet-client "system:node:${node}" system:nodes client
  cert kubelet "${node}" "" server "DNS:${node},DNS:localhost,IP:127.0.0.1"
  if [[ ! -s ${PKI}/sa.key ]]; then
    openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
    chmod 600 "${PKI}/sa.key"
    openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  fi
  kubeconfig "${ETC}/admin.conf" kubernetes-admin admin
  kubeconfig "${ETC}/controller-manager.conf" system:kube-controller-manager controller-manager
  kubeconfig "${ETC}/scheduler.conf" system:kube-scheduler scheduler
  kubeconfig "${ETC}/kubelet.conf" "system:node:${node}" kubelet-client
}

# ------------------------------------------------------------------ sim node
make_sim_root() {
  local py want have=""
  want=${METAX_SIM_PRESET}
  [[ -f ${STATE}/sim-preset ]] && have=$(cat "${STATE}/sim-preset")
  if [[ -d ${METAX_SIM_ROOT} && ${have} == "${want}" ]]; then
    log "simulated MetaX node (${want}) present at ${METAX_SIM_ROOT}"
    return 0
  fi
  ensure_collection_path
  py=$(project_python)
  mkdir -p "$(dirname "${METAX_SIM_ROOT}")"
  if "${py}" -c 'import ansible_collections.metax.gpu.plugins.module_utils.sim.__main__' 2>/dev/null; then
    "${py}" -m ansible_collections.metax.gpu.plugins.module_utils.sim create --force \
      --preset "${want}" "${METAX_SIM_ROOT}" >&2 ||
      die "the simulated node generator failed for preset ${want} (METAX_SIM_PRESET)"
  else
    warn "simulated node generator not importable with ${py}; creating an empty ${METAX_SIM_ROOT}"
    mkdir -p "${METAX_SIM_ROOT}"
  fi
  echo "${want}" >"${STATE}/sim-preset"
}

# ------------------------------------------------------------------ registries
registries() {
  local d=${STATE}/registry a=${STATE}/registry-auth f
  mkdir -p "${d}/data" "${a}/data" "${a}/certs.d/${METAX_REGISTRY_AUTH}"
  for f in "${d}/secret" "${a}/secret"; do
    [[ -s ${f} ]] || (umask 077 && openssl rand -hex 16 >"${f}")
  done
  cat >"${d}/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${d}/data
  delete:
    enabled: true
http:
  addr: ${METAX_REGISTRY}
  secret: $(cat "${d}/secret")
EOF
  if [[ ! -s ${a}/password ]]; then
    (umask 077 && openssl rand -hex 16 >"${a}/password")
  fi
  if [[ ! -s ${a}/htpasswd ]]; then
    htpasswd -Bic "${a}/htpasswd" "${METAX_REGISTRY_USER}" <"${a}/password" 2>/dev/null
  fi
  if [[ ! -s ${a}/tls.crt ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=metax-gpu local registry" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
      -keyout "${a}/tls.key" -out "${a}/tls.crt" 2>/dev/null
    chmod 600 "${a}/tls.key"
  fi
  cp "${a}/tls.crt" "${a}/certs.d/${METAX_REGISTRY_AUTH}/ca.crt"
  cat >"${a}/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${a}/data
  delete:
    enabled: true
http:
  addr: ${METAX_REGISTRY_AUTH}
  secret: $(cat "${a}/secret")
  tls:
    certificate: ${a}/tls.crt
    key: ${a}/tls.key
auth:
  htpasswd:
    realm: metax-gpu-registry
    path: ${a}/htpasswd
EOF
  chmod 600 "${a}/config.yml" "${d}/config.yml"
  START_CONFIG="${d}/config.yml" start registry /usr/bin/docker-registry serve "${d}/config.yml"
  START_CONFIG="${a}/config.yml ${a}/htpasswd ${a}/tls.crt" \
    start registry-auth /usr/bin/docker-registry serve "${a}/config.yml"
  wait_for "registry ${METAX_REGISTRY}" 30 registry curl -fsS --max-time 2 "http://${METAX_REGISTRY}/v2/"
  wait_for "registry ${METAX_REGISTRY_AUTH}" 30 registry-auth \
    curl -fsS --max-time 2 --cacert "${a}/tls.crt" -u "${METAX_REGISTRY_USER}:$(cat "${a}/password")" \
    "https://${METAX_REGISTRY_AUTH}/v2/"
}

# ------------------------------------------------------------------ network
# Pods reach the apiserver (which listens on 127.0.0.1 only) at the service IP
# 10.96.0.1:443 as usual: that address is put on lo (so nothing aimed at the
# service range can leave the machine) and DNAT'ed to 127.0.0.1:6443, from
# the host (OUTPUT: hostNetwork pods) and from the pod bridge (PREROUTING,
# with route_localnet on the bridge only). Pods get no default route and
# nothing is forwarded between the bridge and other interfaces.
network_up() {
  local d=${STATE}/cni
  mkdir -p "${d}/net.d" "${d}/ipam"
  cat >"${d}/net.d/10-${CNI_NAME}.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "${CNI_NAME}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${d}/ipam",
        "ranges": [[{"subnet": "${POD_CIDR}", "gateway": "${POD_GW}"}]],
        "routes": [{"dst": "${SERVICE_CIDR}"}]
      }
    }
  ]
}
EOF
  if ! ip link show "${BRIDGE}" >/dev/null 2>&1; then
    ip link add "${BRIDGE}" type bridge
    ip addr add "${POD_GW}/24" dev "${BRIDGE}"
    ip link set "${BRIDGE}" up
  fi
  sysctl -qw "net.ipv4.conf.${BRIDGE}.route_localnet=1"
  [[ $(ip -4 -o addr show dev lo) == *" ${SERVICE_IP}/32 "* ]] || ip addr add "${SERVICE_IP}/32" dev lo
  local rule
  iptables -t nat -N "${CHAIN}" 2>/dev/null || true
  iptables -t nat -F "${CHAIN}"
  iptables -t nat -A "${CHAIN}" -d "${SERVICE_IP}/32" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:${METAX_APISERVER_PORT}"
  for rule in OUTPUT PREROUTING; do
    iptables -t nat -C "${rule}" -j "${CHAIN}" 2>/dev/null || iptables -t nat -I "${rule}" -j "${CHAIN}"
  done
  iptables -t filter -N "${CHAIN_FWD}" 2>/dev/null || true
  iptables -t filter -F "${CHAIN_FWD}"
  iptables -t filter -A "${CHAIN_FWD}" -i "${BRIDGE}" ! -o "${BRIDGE}" -j DROP
  iptables -t filter -A "${CHAIN_FWD}" -o "${BRIDGE}" ! -i "${BRIDGE}" -j DROP
  iptables -t filter -C FORWARD -j "${CHAIN_FWD}" 2>/dev/null || iptables -t filter -I FORWARD -j "${CHAIN_FWD}"
}

# ------------------------------------------------------------------ containerd
containerd_up() {
  local d=${STATE}/containerd a=${STATE}/registry-auth
  mkdir -p "${d}" "${RUN}/containerd"
  (
    umask 077
    cat >"${d}/config.toml" <<EOF
# Generated by scripts/cluster/cluster.sh: the local cluster's own containerd
# (own root, state and socket; the machine's containerd, if any, is untouched).
version = 2
root = "${d}/root"
state = "${RUN}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "${CONTAINERD_SOCK}"

[ttrpc]
  address = "${CONTAINERD_SOCK}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "${d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${METAX_PAUSE_IMAGE}"
  # root cannot lower oom_score_adj on these machines (no CAP_SYS_RESOURCE in
  # the bounding set): without this every sandbox fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "${RUN}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${STATE}/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."${METAX_REGISTRY}"]
    endpoint = ["http://${METAX_REGISTRY}"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."localhost:${METAX_REGISTRY_PORT}"]
    endpoint = ["http://${METAX_REGISTRY}"]
  # containerd would use plain HTTP for a loopback host without an explicit endpoint
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."${METAX_REGISTRY_AUTH}"]
    endpoint = ["https://${METAX_REGISTRY_AUTH}"]
  [plugins."io.containerd.grpc.v1.cri".registry.configs."${METAX_REGISTRY_AUTH}".tls]
    ca_file = "${a}/tls.crt"
  [plugins."io.containerd.grpc.v1.cri".registry.configs."${METAX_REGISTRY_AUTH}".auth]
    username = "${METAX_REGISTRY_USER}"
    password = "$(cat "${a}/password")"
EOF
  )
  START_CONFIG="${d}/config.toml" start containerd /usr/bin/containerd --config "${d}/config.toml"
  wait_for "containerd (${CONTAINERD_SOCK})" 60 containerd ctr --address "${CONTAINERD_SOCK}" version
  # Images the node needs without any pull: the pod sandbox and the scheduler.
  local img archive
  for img in pause scheduler; do
    archive=$("${CLUSTER_SCRIPTS}/images.sh" archive "${img}")
    ctr_k8s images import "${archive}" >/dev/null ||
      die "importing ${archive} into containerd failed"
  done
  local have
  have=$(ctr_k8s images ls -q)
  for img in "${METAX_PAUSE_IMAGE}" "${METAX_SCHEDULER_IMAGE}"; do
    grep -qxF "${img}" <<<"${have}" || die "the image ${img} is not in containerd after import"
  done
}

# ------------------------------------------------------------------ control plane
etcd_up() {
  mkdir -p "${STATE}/etcd"
  chmod 700 "${STATE}/etcd"
  start etcd /usr/bin/etcd --name metax --data-dir "${STATE}/etcd" \
    --listen-client-urls "http://127.0.0.1:${METAX_ETCD_PORT}" \
    --advertise-client-urls "http://127.0.0.1:${METAX_ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${METAX_ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${METAX_ETCD_PEER_PORT}" \
    --initial-cluster "metax=http://127.0.0.1:${METAX_ETCD_PEER_PORT}" \
    --initial-cluster-state new --snapshot-count 10000 --log-level warn
  wait_for "etcd" 60 etcd curl -fsS --max-time 2 "http://127.0.0.1:${METAX_ETCD_PORT}/health"
}

apiserver_up() {
  start kube-apiserver "${BIN}/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="${METAX_APISERVER_PORT}" \
    --etcd-servers="http://127.0.0.1:${METAX_ETCD_PORT}" \
    --endpoint-reconciler-type=none \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --client-ca-file="${PKI}/ca.crt" \
    --tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
    --kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
    --kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="${PKI}/ca.crt" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="${PKI}/sa.pub" --service-account-signing-key-file="${PKI}/sa.key" \
    --profiling=false --v=1
  wait_for "kube-apiserver ${APISERVER}/readyz" 180 kube-apiserver \
    https_ok --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" "${APISERVER}/readyz"
}

controller_manager_up() {
  mkdir -p "${STATE}/kcm-certs"
  start kube-controller-manager "${BIN}/kube-controller-manager" \
    --kubeconfig="${ETC}/controller-manager.conf" \
    --authentication-kubeconfig="${ETC}/controller-manager.conf" \
    --authorization-kubeconfig="${ETC}/controller-manager.conf" \
    --bind-address=127.0.0.1 --secure-port="${KCM_PORT}" --cert-dir="${STATE}/kcm-certs" \
    --client-ca-file="${PKI}/ca.crt" --root-ca-file="${PKI}/ca.crt" \
    --cluster-signing-cert-file="${PKI}/ca.crt" --cluster-signing-key-file="${PKI}/ca.key" \
    --service-account-private-key-file="${PKI}/sa.key" --use-service-account-credentials=true \
    --controllers='*,bootstrapsigner,tokencleaner' --leader-elect=false \
    --profiling=false --v=1
  wait_for "kube-controller-manager /healthz" 120 kube-controller-manager \
    curl -fsSk --max-time 2 "https://127.0.0.1:${KCM_PORT}/healthz"
}

scheduler_manifest() {
  # kubeadm's kube-scheduler static pod, with the locally built image. Written
  # only when absent: later tooling (metax.gpu.gpu_aware) patches this file.
  local f=${MANIFESTS}/kube-scheduler.yaml
  [[ -f ${f} ]] && return 0
  cat >"${f}.tmp" <<EOF
apiVersion: v1
kind: Pod
metadata:
  labels:
    component: kube-scheduler
    tier: control-plane
  name: kube-scheduler
  namespace: kube-system
spec:
  containers:
    - command:
        - kube-scheduler
        - --authentication-kubeconfig=/etc/kubernetes/scheduler.conf
        - --authorization-kubeconfig=/etc/kubernetes/scheduler.conf
        - --bind-address=127.0.0.1
        - --kubeconfig=/etc/kubernetes/scheduler.conf
        - --leader-elect=true
      image: ${METAX_SCHEDULER_IMAGE}
      imagePullPolicy: IfNotPresent
      livenessProbe:
        failureThreshold: 8
        httpGet:
          host: 127.0.0.1
          path: /livez
          port: ${SCHED_PORT}
          scheme: HTTPS
        initialDelaySeconds: 10
        periodSeconds: 10
        timeoutSeconds: 15
      name: kube-scheduler
      readinessProbe:
        failureThreshold: 3
        httpGet:
          host: 127.0.0.1
          path: /readyz
          port: ${SCHED_PORT}
          scheme: HTTPS
        periodSeconds: 1
        timeoutSeconds: 15
      resources:
        requests:
          cpu: 100m
      startupProbe:
        failureThreshold: 24
        httpGet:
          host: 127.0.0.1
          path: /livez
          port: ${SCHED_PORT}
          scheme: HTTPS
        initialDelaySeconds: 10
        periodSeconds: 10
        timeoutSeconds: 15
      volumeMounts:
        - mountPath: /etc/kubernetes/scheduler.conf
          name: kubeconfig
          readOnly: true
  hostNetwork: true
  priority: 2000001000
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  volumes:
    - hostPath:
        path: /etc/kubernetes/scheduler.conf
        type: FileOrCreate
      name: kubeconfig
status: {}
EOF
  mv "${f}.tmp" "${f}"
}

kubelet_up() {
  local node=$1 d=${STATE}/kubelet
  mkdir -p "${d}" "${KUBELET_DIR}" "${STATE}/pod-logs"
  touch "${KUBELET_DIR}/${MARKER_NAME}"
  cat >"${d}/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: ${METAX_KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${PKI}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: ${PKI}/kubelet.crt
tlsPrivateKeyFile: ${PKI}/kubelet.key
rotateCertificates: false
serverTLSBootstrap: false
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://${CONTAINERD_SOCK}
imageServiceEndpoint: unix://${CONTAINERD_SOCK}
staticPodPath: ${MANIFESTS}
podLogsDir: ${STATE}/pod-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
maxPods: 110
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusReportFrequency: 10s
# Allocatable changes (a GPU turning unhealthy) reach the Node object at the
# next status update; 1s keeps that within gpu-device's healthyInterval + 2s.
nodeStatusUpdateFrequency: 1s
EOF
  START_CONFIG="${d}/config.yaml" start kubelet "${BIN}/kubelet" --config="${d}/config.yaml" --kubeconfig="${ETC}/kubelet.conf" \
    --hostname-override="${node}" --root-dir="${KUBELET_DIR}" --v=1
  wait_for "kubelet /healthz" 120 kubelet curl -fsS --max-time 2 "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"
}

node_ready() {
  [[ $(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
scheduler_ready() {
  [[ $(kubectl -n kube-system get pod "kube-scheduler-$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
default_sa() { kubectl -n default get serviceaccount default >/dev/null 2>&1; }

# ------------------------------------------------------------------ env/json
write_env() {
  local node=$1
  cat >"${STATE}/cluster.env" <<EOF
export KUBECONFIG=${ADMIN_CONF}
export METAX_KUBE_BIN=${BIN}
export METAX_NODE_NAME=${node}
export METAX_APISERVER=${APISERVER}
export METAX_REGISTRY=${METAX_REGISTRY}
export METAX_REGISTRY_AUTH=${METAX_REGISTRY_AUTH}
export METAX_REGISTRY_AUTH_USER=${METAX_REGISTRY_USER}
export METAX_REGISTRY_AUTH_PASSWORD_FILE=${STATE}/registry-auth/password
export METAX_REGISTRY_AUTH_CA=${STATE}/registry-auth/tls.crt
export METAX_REGISTRY_AUTH_CERT_DIR=${STATE}/registry-auth/certs.d/${METAX_REGISTRY_AUTH}
export METAX_SIM_ROOT=${METAX_SIM_ROOT}
export METAX_SIM_PRESET=$(cat "${STATE}/sim-preset" 2>/dev/null || echo "${METAX_SIM_PRESET}")
export METAX_CONTAINERD_ADDRESS=${CONTAINERD_SOCK}
export METAX_PAUSE_IMAGE=${METAX_PAUSE_IMAGE}
export METAX_SCHEDULER_IMAGE=${METAX_SCHEDULER_IMAGE}
export METAX_BASE_IMAGE=${METAX_BASE_IMAGE}
export METAX_REGISTRY_BASE_IMAGE=${METAX_REGISTRY}/metax-gpu/base:${METAX_BASE_SUITE}
export CONTAINERS_CONF=${CONTAINERS_CONF}
export CONTAINERS_REGISTRIES_CONF=${CONTAINERS_REGISTRIES_CONF}
export PATH=${BIN}:\${PATH}
EOF
}

cmd_env() {
  [[ -f ${STATE}/cluster.env ]] || die "no cluster state in ${STATE}: run 'make cluster-up' first"
  cat "${STATE}/cluster.env"
}

cmd_json() {
  [[ -f ${STATE}/cluster.env ]] || die "no cluster state in ${STATE}: run 'make cluster-up' first"
  # shellcheck disable=SC1091
  (source "${STATE}/cluster.env" && python3 - <<'PY'
import json, os
keys = ["KUBECONFIG", "METAX_KUBE_BIN", "METAX_NODE_NAME", "METAX_APISERVER", "METAX_REGISTRY",
        "METAX_REGISTRY_AUTH", "METAX_REGISTRY_AUTH_USER", "METAX_REGISTRY_AUTH_PASSWORD_FILE",
        "METAX_REGISTRY_AUTH_CA", "METAX_REGISTRY_AUTH_CERT_DIR", "METAX_SIM_ROOT", "METAX_SIM_PRESET",
        "METAX_CONTAINERD_ADDRESS", "METAX_PAUSE_IMAGE", "METAX_SCHEDULER_IMAGE", "METAX_BASE_IMAGE",
        "METAX_REGISTRY_BASE_IMAGE", "CONTAINERS_CONF", "CONTAINERS_REGISTRIES_CONF"]
print(json.dumps({k: os.environ.get(k, "") for k in keys}, indent=2, sort_keys=True))
PY
  )
}

# ------------------------------------------------------------------ up
cmd_up() {
  require_root
  local node
  phase_start "debian packages"
  "${CLUSTER_SCRIPTS}/packages.sh"
  phase_start "kubernetes binaries"
  "${CLUSTER_SCRIPTS}/build-k8s.sh"
  phase_start "preflight"
  preflight
  mkdir -p "${STATE}" "${LOGS}" "${PIDS}"
  chmod 700 "${STATE}"
  record_baseline
  mkdir -p "${RUN}"
  node=$(node_name)
  echo "${node}" >"${STATE}/node-name"
  log "node name: ${node}"
  phase_start "pki + kubeconfigs"
  make_pki "${node}"
  phase_start "simulated node"
  make_sim_root
  phase_start "registries"
  registries
  phase_start "images (build + push)"
  "${CLUSTER_SCRIPTS}/images.sh" build
  "${CLUSTER_SCRIPTS}/images.sh" push
  phase_start "network (cni, service ip)"
  network_up
  phase_start "containerd"
  containerd_up
  phase_start "etcd"
  etcd_up
  phase_start "kube-apiserver"
  apiserver_up
  phase_start "kube-controller-manager"
  controller_manager_up
  phase_start "kubelet + static kube-scheduler"
  scheduler_manifest
  kubelet_up "${node}"
  wait_for "node ${node} Ready" 180 kubelet node_ready "${node}"
  kubectl label node "${node}" --overwrite node-role.kubernetes.io/control-plane= >/dev/null
  wait_for "static pod kube-system/kube-scheduler-${node} Ready" 180 kubelet scheduler_ready "${node}"
  wait_for "default ServiceAccount" 60 kube-controller-manager default_sa
  write_env "${node}"
  phase_report "cluster up"
  cmd_status
}

# restart-kubelet: what a kubelet upgrade or crash does to device plugins
# (kubelet.sock recreated, plugin sockets removed), for tests and demos.
cmd_restart_kubelet() {
  require_root
  running kubelet || die "the kubelet is not running; start the cluster first: make cluster-up"
  local node
  node=$(node_name)
  stop kubelet
  kubelet_up "${node}"
  wait_for "node ${node} Ready" 120 kubelet node_ready "${node}"
  log "kubelet restarted"
}

# ------------------------------------------------------------------ status
cmd_status() {
  local c ok=0 total=0 node
  if [[ ! -d ${STATE} ]]; then
    echo "cluster: down (no state in ${STATE})"
    return 3
  fi
  echo "cluster state: ${STATE}"
  for c in containerd etcd kube-apiserver kube-controller-manager kubelet registry registry-auth; do
    total=$((total + 1))
    if running "${c}"; then
      ok=$((ok + 1))
      printf '  %-24s running (pid %s)\n' "${c}" "$(pid_of "${c}")"
    elif [[ -f ${PIDS}/${c}.pid ]]; then
      printf '  %-24s NOT RUNNING (stale PID file %s)\n' "${c}" "$(pid_of "${c}")"
    else
      printf '  %-24s stopped\n' "${c}"
    fi
  done
  node=$(cat "${STATE}/node-name" 2>/dev/null || echo "?")
  cat <<EOF
kubeconfig (admin):   ${ADMIN_CONF}
apiserver:            ${APISERVER}
kubectl:              ${BIN}/kubectl
node:                 ${node}
registry (http):      ${METAX_REGISTRY}
registry (tls+auth):  ${METAX_REGISTRY_AUTH}  user ${METAX_REGISTRY_USER}, password in ${STATE}/registry-auth/password, CA ${STATE}/registry-auth/tls.crt
simulated node root:  ${METAX_SIM_ROOT} (preset $(cat "${STATE}/sim-preset" 2>/dev/null || echo "?"))
static pod manifests: ${MANIFESTS}
containerd socket:    ${CONTAINERD_SOCK}
logs:                 ${LOGS}
use it:               eval "\$(scripts/cluster/cluster.sh env)"
EOF
  if running kube-apiserver && [[ -f ${ADMIN_CONF} ]]; then
    kubectl get nodes -o wide 2>/dev/null | sed 's/^/  /' || true
    kubectl -n kube-system get pods 2>/dev/null | sed 's/^/  /' || true
  fi
  if ((ok == total)); then
    echo "cluster: up"
    return 0
  elif ((ok == 0)); then
    echo "cluster: down (state left in ${STATE}: run 'make cluster-down' to clean up)"
    return 3
  fi
  echo "cluster: PARTIAL (${ok}/${total} components running): run 'make cluster-down' then 'make cluster-up'"
  return 1
}

# ------------------------------------------------------------------ down
# Mount points below PREFIX (deepest first).
mounts_under() {
  awk -v p="$1" '{ m = $5; gsub(/\\040/, " ", m); if (m == p || index(m, p "/") == 1) print m }' \
    /proc/self/mountinfo | sort -r
}

unmount_under() {
  local p m i
  for p in "$@"; do
    for ((i = 0; i < 3; i++)); do
      while IFS= read -r m; do
        [[ -n ${m} ]] || continue
        umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || warn "cannot unmount ${m}"
      done < <(mounts_under "${p}")
      [[ -z $(mounts_under "${p}") ]] && break
    done
  done
}

drain_pods() {
  # Let the kubelet tear pods down properly (CNI DEL, volume unmounts) while
  # it and the apiserver still run: static pods by removing the manifests we
  # put there, other pods by force deletion.
  running kubelet && running kube-apiserver && [[ -f ${ADMIN_CONF} ]] || return 0
  log "removing pods (kubelet tears down sandboxes, networks and volumes)"
  mkdir -p "${STATE}/manifests-removed"
  local f rel
  while IFS= read -r f; do
    rel=${f#"${ETC}"/}
    grep -qxF "./${rel}" "${BASELINE}/etc-files" 2>/dev/null && continue
    mv "${f}" "${STATE}/manifests-removed/" 2>/dev/null || true
  done < <(find "${MANIFESTS}" -mindepth 1 -maxdepth 1 -type f 2>/dev/null)
  kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  local t0
  t0=$(date +%s)
  while (($(date +%s) - t0 < 45)); do
    [[ -z $(ctr_k8s tasks ls -q 2>/dev/null) ]] && break
    sleep 1
  done
  # the kubelet removes stopped sandboxes lazily; stopping them is enough
}

kill_containers() {
  # Whatever still runs in our containerd: kill tasks, delete containers
  # (their shims exit with them).
  running containerd || return 0
  local id
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
    ctr_k8s tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true
  done
  sleep 1
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
    ctr_k8s tasks delete -f "${id}" >/dev/null 2>&1 || true
  done
  for id in $(ctr_k8s containers ls -q 2>/dev/null); do
    ctr_k8s containers delete "${id}" >/dev/null 2>&1 || true
  done
}

kill_leftover_shims() {
  # containerd-shim-runc-v2 processes started by OUR containerd (they carry
  # its socket address on their command line); also their children.
  local pid cmdline found=0
  for pid in $(pgrep -f -- "-address ${CONTAINERD_SOCK}" 2>/dev/null || true); do
    cmdline=$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null) || continue
    [[ ${cmdline} == *containerd-shim* ]] || continue
    pkill -KILL -P "${pid}" 2>/dev/null || true
    kill -KILL "${pid}" 2>/dev/null || true
    found=1
  done
  if ((found)); then warn "killed leftover containerd shims of this cluster"; fi
}

remove_netns() {
  local n
  [[ -d /run/netns ]] || return 0
  for n in /run/netns/cni-*; do
    [[ -e ${n} ]] || continue
    n=${n##*/}
    grep -qxF "${n}" "${BASELINE}/netns" 2>/dev/null && continue
    umount "/run/netns/${n}" 2>/dev/null || umount -l "/run/netns/${n}" 2>/dev/null || true
    rm -f "/run/netns/${n}"
  done
  if ! existed_before /run/netns && [[ -d /run/netns ]] && [[ -z $(ls -A /run/netns) ]]; then
    # /run/netns is made a shared bind mount of itself by ip-netns/containerd
    umount /run/netns 2>/dev/null || true
    rmdir /run/netns 2>/dev/null || true
  fi
}

remove_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d ${d} ]] || continue
    grep -qxF "${d}" "${BASELINE}/cgroups" 2>/dev/null && continue
    find "${d}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ -d ${d} ]] && warn "cgroup ${d} could not be removed (processes left in it?)"
  done
  return 0
}

network_down() {
  local t tool chain line
  if ip link show "${BRIDGE}" >/dev/null 2>&1; then ip link delete "${BRIDGE}" 2>/dev/null || true; fi
  if [[ $(ip -4 -o addr show dev lo 2>/dev/null) == *" ${SERVICE_IP}/32 "* ]]; then
    ip addr del "${SERVICE_IP}/32" dev lo || true
  fi
  # Our chains, plus chains the kubelet/CNI added (KUBE-*, CNI-*) that did not
  # exist before `up`: remove the jumps to them, flush, delete.
  for tool in iptables ip6tables; do
    command -v "${tool}" >/dev/null || continue
    for t in filter nat mangle raw; do
      local tag=${t}
      [[ ${tool} == ip6tables ]] && tag=6${t}
      for chain in $("${tool}" -t "${t}" -S 2>/dev/null | awk '$1 == "-N" {print $2}'); do
        case ${chain} in
          METAX-GPU-CLUSTER*) ;;
          KUBE-* | CNI-*) grep -qxF "${tag} ${chain}" "${BASELINE}/chains" 2>/dev/null && continue ;;
          *) continue ;;
        esac
        while IFS= read -r line; do
          # shellcheck disable=SC2086
          "${tool}" -t "${t}" ${line/-A/-D} 2>/dev/null || true
        done < <("${tool}" -t "${t}" -S 2>/dev/null | grep -E -- "^-A .* -j ${chain}( |$)" || true)
        "${tool}" -t "${t}" -F "${chain}" 2>/dev/null || true
        "${tool}" -t "${t}" -X "${chain}" 2>/dev/null || warn "cannot delete ${tool} ${t} chain ${chain}"
      done
    done
  done
  if [[ -f ${BASELINE}/ip_forward ]]; then
    cat "${BASELINE}/ip_forward" >/proc/sys/net/ipv4/ip_forward
  fi
  # CNI result cache entries of our network
  rm -f /var/lib/cni/results/"${CNI_NAME}"-* 2>/dev/null || true
}

# remove_new DIR LISTFILE: remove what DIR holds now that LISTFILE (relative
# `find` output from the baseline) did not list; DIR itself if it is new.
remove_new() {
  local dir=$1 list=$2 rel
  [[ -d ${dir} ]] || return 0
  if ! existed_before "${dir}"; then
    rm -rf "${dir}"
    return 0
  fi
  (cd "${dir}" && find . -mindepth 1 -depth) | while IFS= read -r rel; do
    grep -qxF "${rel}" "${list}" 2>/dev/null && continue
    rm -rf "${dir:?}/${rel#./}"
  done
}

cmd_down() {
  require_root
  if [[ ! -d ${STATE} ]]; then
    # Perhaps only half-made: files of ours without state? Only our marker counts.
    if [[ -f ${ETC}/${MARKER_NAME} ]]; then
      warn "no ${STATE} but ${ETC}/${MARKER_NAME} exists: removing the cluster's files there"
      rm -rf "${ETC}"
      [[ -f ${KUBELET_DIR}/${MARKER_NAME} ]] && { unmount_under "${KUBELET_DIR}"; rm -rf "${KUBELET_DIR}"; }
    fi
    log "cluster is down (nothing recorded in ${STATE})"
    return 0
  fi
  phase_start "drain pods"
  # no controller may recreate what is drained
  stop kube-controller-manager
  drain_pods
  phase_start "stop kubelet"
  stop kubelet
  phase_start "stop containers + containerd"
  kill_containers
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  stop containerd
  kill_leftover_shims
  stop registry
  stop registry-auth
  phase_start "unmount + remove"
  remove_netns
  unmount_under "${KUBELET_DIR}" "${STATE}" "${RUN}" "${METAX_SIM_ROOT}"
  remove_cgroups
  network_down
  [[ -f ${BASELINE}/complete ]] || warn "no baseline recorded in ${BASELINE}; removing only the cluster's own dirs"
  remove_new "${ETC}" "${BASELINE}/etc-files"
  remove_new "${KUBELET_DIR}" "${BASELINE}/kubelet-files"
  local p
  for p in /var/log/pods /var/log/containers /var/lib/cni "$(dirname "${METAX_SIM_ROOT}")" "${RUN}"; do
    if [[ -e ${p} ]] && ! existed_before "${p}"; then rm -rf "${p}"; fi
  done
  # containerd 1.6 puts shim sockets under /run/containerd/s whatever its
  # state dir; remove that tree when it was not there before and is empty now.
  if [[ -d /run/containerd ]] && ! existed_before /run/containerd; then
    find /run/containerd -depth -type d -empty -delete 2>/dev/null || true
  fi
  # Keep the last run's logs in the cache (not on the machine's paths).
  if [[ -d ${LOGS} ]]; then
    rm -rf "${METAX_CACHE_DIR}/last-cluster-logs"
    mkdir -p "${METAX_CACHE_DIR}"
    cp -a "${LOGS}" "${METAX_CACHE_DIR}/last-cluster-logs" 2>/dev/null || true
  fi
  unmount_under "${STATE}"
  rm -rf "${STATE}"
  phase_report "cluster down"
  log "cluster is down; logs of this run: ${METAX_CACHE_DIR}/last-cluster-logs"
}

# ------------------------------------------------------------------ main
mkdir -p "${METAX_CACHE_DIR}"
case ${1:-} in
  up | down | restart-kubelet)
    exec 8>"${METAX_CACHE_DIR}/cluster.lock"
    flock -n 8 || { log "another cluster.sh up/down is running; waiting for it"; flock 8; }
    "cmd_${1//-/_}"
    ;;
  status) cmd_status ;;
  env) cmd_env ;;
  podman-env)
    # usable without a cluster (Molecule, image builds)
    printf 'export CONTAINERS_CONF=%s\nexport CONTAINERS_REGISTRIES_CONF=%s\n' \
      "${CONTAINERS_CONF}" "${CONTAINERS_REGISTRIES_CONF}"
    ;;
  json) cmd_json ;;
  *)
    echo "usage: $0 up|down|status|restart-kubelet|env|json|podman-env" >&2
    exit 2
    ;;
esac
