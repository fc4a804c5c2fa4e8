#!/usr/bin/env bash
# The local Kubernetes cluster of metax.gpu (tests, CI, demo): etcd,
# kube-apiserver, kube-controller-manager as host processes; one or more
# simulated GPU nodes, each a kubelet + containerd 2 (+ runc) in its own
# network and mount namespace with its own simulated MetaX root; the first
# node carries the static-pod kube-scheduler from /etc/kubernetes/manifests;
# bridge CNI per node, two registries (plain HTTP and htpasswd+TLS). The
# apiserver and registries bind every address; an iptables INPUT chain
# (CHAIN_IN) drops their ports except on loopback and the cluster bridge.
#
# Usage: [NODES="8xC500 4xN100 ..."] cluster.sh up | down | status | env | json | inventory
#          | restart-kubelet [NODE] | podman-env | plan
#   up      idempotent; builds/installs what is missing first; NODES: one
#           preset per node (default: one 8xC500 node)
#   down    stops only what `up` started (PID files), unmounts, removes what it
#           added (files, CNI, iptables chains, cgroups); always safe to run
#   status  components, kubeconfig, registries, node; exit 0 when all run
#   env     shell exports for using the cluster: eval "$(cluster.sh env)"
#   json    the same as JSON with the node list (used by tests/integration/conftest.py)
#   inventory  an Ansible YAML inventory of the running cluster
#   podman-env  CONTAINERS_CONF/CONTAINERS_REGISTRIES_CONF exports (no cluster needed)
#   plan    the node table `up` makes of NODES: "INDEX NAME PRESET" per line
#           (no cluster needed; with one running, its table)
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
SERVICE_CIDR=10.96.0.0/12
SERVICE_IP=10.96.0.1
# Node i (1-based) gets pod CIDR 10.244.<i-1>.0/24 and the address
# 10.250.0.<10+i> on the cluster bridge; the host is 10.250.0.1 there.
CLUSTER_NET=10.250.0.0/24
HOST_IP=10.250.0.1
CLUSTER_BRIDGE=metax-br0
# the pod bridge inside every node's network namespace (same name in each)
BRIDGE=metax-cni0
NETNS_PREFIX=metax-gpu-
VETH_PREFIX=metax-v
# cgroups of the nodes (overridable: a second cluster in a container sharing the host cgroup tree)
CGROUP_PREFIX=${METAX_CGROUP_PREFIX:-metax-gpu-}
CNI_NAME=metax-gpu-cluster
CHAIN=METAX-GPU-CLUSTER
CHAIN_FWD=METAX-GPU-CLUSTER-FWD
CHAIN_IN=METAX-GPU-CLUSTER-IN
SCHED_PORT=10259
KCM_PORT=10257
KUBELET_HEALTHZ_PORT=10248
KUBE_PROXY_HEALTHZ_PORT=10256
APISERVER=https://127.0.0.1:${METAX_APISERVER_PORT}
# what the nodes (and pods, through the service IP) use
APISERVER_NODES=https://${HOST_IP}:${METAX_APISERVER_PORT}
SIM_PARENT=$(dirname "${METAX_SIM_ROOT}")
# NODES unset: the running cluster's nodes, else one ${METAX_SIM_PRESET} node
if [[ -z ${NODES:-} && -f ${STATE}/node-table ]]; then
  NODES=$(awk '{printf "%s ", $3}' "${STATE}/node-table")
fi
: "${NODES:=${METAX_SIM_PRESET}}"
# Host paths the cluster creates and `down` removes unless they pre-existed.
TRACKED_PATHS=("${ETC}" "${KUBELET_DIR}" /var/log/pods /var/log/containers /var/lib/cni
  "${SIM_PARENT}" "${RUN}" /run/netns /run/containerd /etc/cdi /run/cdi)

BIN=$(k8s_bin_dir)
CTRD_BIN=$(containerd_bin_dir)
HELM_BIN=$(helm_bin_dir)
# containerd finds its shim on PATH
export PATH=${CTRD_BIN}:${PATH}
kubectl() { "${BIN}/kubectl" --kubeconfig "${ADMIN_CONF}" "$@"; }

# ------------------------------------------------------------------ nodes
# The node table, fixed at `up` in ${STATE}/node-table: "INDEX NAME PRESET".
NODE_IDX=()
NODE_NAMES=()
NODE_PRESETS=()
load_nodes() {
  local i n p
  NODE_IDX=() NODE_NAMES=() NODE_PRESETS=()
  [[ -f ${STATE}/node-table ]] || return 1
  while read -r i n p; do
    NODE_IDX+=("${i}") NODE_NAMES+=("${n}") NODE_PRESETS+=("${p}")
  done <"${STATE}/node-table"
  ((${#NODE_NAMES[@]}))
}
# The pure parts that moved to the Python package tests/localcluster (standard
# library only: python3 without the venv; docs/local-cluster.md).
localcluster() { PYTHONPATH="${REPO_ROOT}/tests${PYTHONPATH:+:${PYTHONPATH}}" python3 -m localcluster "$@"; }
# plan_nodes: the node table NODES asks for (vm, vm-2, ...; tests/localcluster/nodes.py)
plan_nodes() { NODES=${NODES} localcluster plan; }
node_ip() { echo "10.250.0.$((10 + $1))"; }
pod_cidr() { echo "10.244.$(($1 - 1)).0/24"; }
pod_gw() { echo "10.244.$(($1 - 1)).1"; }
netns_of() { echo "${NETNS_PREFIX}$1"; }
node_dir() { echo "${STATE}/nodes/$1"; }
node_run() { echo "${RUN}/nodes/$1"; }
sim_dir_of() { echo "${SIM_PARENT}/$1"; }
sock_of() { echo "$(node_run "$1")/containerd.sock"; }
cgroup_root_of() { echo "/${CGROUP_PREFIX}$1"; }
ctr_node() {
  local node=$1
  shift
  "${CTRD_BIN}/ctr" --address "$(sock_of "${node}")" -n k8s.io "$@"
}
# Run a command inside a node's mount and network namespaces.
in_node() {
  local node=$1 pid
  shift
  pid=$(pid_of "ns-${node}") || die "node ${node}: its namespace holder is not running"
  nsenter -t "${pid}" -m -n -- "$@"
}

# ------------------------------------------------------------------ helpers
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
    printf '%s\n' "${START_WRAP:-}" "${bin}" "$@"
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
  # fd 8 is cluster.lock: the daemon must not inherit (and hold) it.
  # START_WRAP (nsenter/unshare, which exec) runs it inside a node's
  # namespaces with the same PID.
  # shellcheck disable=SC2086 # START_WRAP is a word list
  setsid ${START_WRAP:-} "${bin}" "$@" </dev/null >>"${LOGS}/${name}.log" 2>&1 8>&- &
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
  # kubelets and the scheduler listen inside the nodes' network namespaces
  if ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1 && [[ ! -f ${STATE}/node-table ]]; then
    die "the network interface ${CLUSTER_BRIDGE} exists but no cluster is recorded in ${STATE}: a leftover?
  Remove it (ip link delete ${CLUSTER_BRIDGE}) or run 'make cluster-down', then 'make cluster-up' again."
  fi
  if ip route show "${CLUSTER_NET}" 2>/dev/null | grep -qv "${CLUSTER_BRIDGE}"; then
    die "${CLUSTER_NET} (the local cluster's node network) is already routed on this machine: $(ip route show "${CLUSTER_NET}")"
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

kubeconfig() { # FILE USER CERTNAME [SERVER]
  local file=$1 user=$2 crt=$3 server=${4:-${APISERVER}}
  [[ -s ${file} ]] && return 0
  umask 077
  cat >"${file}" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: kubernetes
    cluster:
      server: ${server}
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
  local node i n
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
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:${SERVICE_IP},IP:${HOST_IP}"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters client
  cert admin kubernetes-admin system:masters client
  cert controller-manager system:kube-controller-manager "" client
  cert scheduler system:kube-scheduler "" client
  # bound to system:node-proxier by the default RBAC policy
  cert kube-proxy system:kube-proxy "" client
  for i in "${!NODE_NAMES[@]}"; do
    node=${NODE_NAMES[$i]}
    n=${NODE_IDX[$i]}
    cert "kubelet-client-${node}" "system:node:${node}" system:nodes client
    cert "kubelet-${node}" "${node}" "" server "DNS:${node},DNS:localhost,IP:127.0.0.1,IP:$(node_ip "${n}")"
  done
  if [[ ! -s ${PKI}/sa.key ]]; then
    openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
    chmod 600 "${PKI}/sa.key"
    openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  fi
  kubeconfig "${ETC}/admin.conf" kubernetes-admin admin
  kubeconfig "${ETC}/controller-manager.conf" system:kube-controller-manager controller-manager
  # the scheduler runs in the first node's network namespace
  kubeconfig "${ETC}/scheduler.conf" system:kube-scheduler scheduler "${APISERVER_NODES}"
  kubeconfig "${STATE}/kube-proxy.conf" system:kube-proxy kube-proxy "${APISERVER_NODES}"
  for node in "${NODE_NAMES[@]}"; do
    mkdir -p "$(node_dir "${node}")"
    kubeconfig "$(node_dir "${node}")/kubelet.conf" "system:node:${node}" "kubelet-client-${node}" "${APISERVER_NODES}"
  done
  # kubeadm's path, for the first (control-plane) node
  [[ -e ${ETC}/kubelet.conf ]] || cp "$(node_dir "${NODE_NAMES[0]}")/kubelet.conf" "${ETC}/kubelet.conf"
}

# ------------------------------------------------------------------ sim node
make_sim_root() { # NODE PRESET
  local node=$1 want=$2 dir py have=""
  dir=$(sim_dir_of "${node}")
  [[ -f $(node_dir "${node}")/sim-preset ]] && have=$(cat "$(node_dir "${node}")/sim-preset")
  ensure_collection_path
  py=$(project_python)
  if [[ -d ${dir} && ${have} == "${want}" ]]; then
    log "simulated MetaX node ${node} (${want}) present at ${dir}"
    # a root made by an older checkout gets this checkout's mx-smi (e.g. the real -L form)
    "${py}" -m ansible_collections.metax.gpu.plugins.module_utils.sim install-mx-smi "${dir}" >/dev/null ||
      die "cannot update the mx-smi of the simulated node at ${dir}"
    return 0
  fi
  mkdir -p "${SIM_PARENT}"
  "${py}" -m ansible_collections.metax.gpu.plugins.module_utils.sim create --force \
    --preset "${want}" "${dir}" >&2 ||
    die "the simulated node generator failed for preset ${want} (NODES=\"${NODES}\")"
  echo "${want}" >"$(node_dir "${node}")/sim-preset"
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
  # loopback for the host, the bridge address for the nodes' containerd
  # (other interfaces: dropped by the ${CHAIN_IN} chain)
  addr: :${METAX_REGISTRY_PORT}
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
      -subj "/CN=metax-gpu local registry" -addext "subjectAltName=IP:127.0.0.1,IP:${HOST_IP},DNS:localhost" \
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
  addr: :${METAX_REGISTRY_AUTH_PORT}
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
# The host holds the cluster bridge ${CLUSTER_BRIDGE} (${HOST_IP}); every node
# is a network namespace joined to it by a veth pair, with its own pod bridge
# and pod CIDR; the host and every node route each pod CIDR to its node.
# Services (the apiserver's at 10.96.0.1:443 included) are kube-proxy's, in
# each node's namespace; the host itself reaches 10.96.0.1:443 by DNAT.
# The apiserver and the registries listen on every address, and the
# ${CHAIN_IN} chain drops their ports on every interface but lo and the bridge;
# nothing is forwarded between the bridge and other interfaces.
network_up() {
  if ! ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1; then
    ip link add "${CLUSTER_BRIDGE}" type bridge
    ip addr add "${HOST_IP}/24" dev "${CLUSTER_BRIDGE}"
    ip link set "${CLUSTER_BRIDGE}" up
  fi
  # the host, as a client, also uses the service IP (as before: OUTPUT DNAT)
  [[ $(ip -4 -o addr show dev lo) == *" ${SERVICE_IP}/32 "* ]] || ip addr add "${SERVICE_IP}/32" dev lo
  iptables -t nat -N "${CHAIN}" 2>/dev/null || true
  iptables -t nat -F "${CHAIN}"
  iptables -t nat -A "${CHAIN}" -d "${SERVICE_IP}/32" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:${METAX_APISERVER_PORT}"
  iptables -t nat -C OUTPUT -j "${CHAIN}" 2>/dev/null || iptables -t nat -I OUTPUT -j "${CHAIN}"
  iptables -t filter -N "${CHAIN_FWD}" 2>/dev/null || true
  iptables -t filter -F "${CHAIN_FWD}"
  iptables -t filter -A "${CHAIN_FWD}" -i "${CLUSTER_BRIDGE}" ! -o "${CLUSTER_BRIDGE}" -j DROP
  iptables -t filter -A "${CHAIN_FWD}" -o "${CLUSTER_BRIDGE}" ! -i "${CLUSTER_BRIDGE}" -j DROP
  iptables -t filter -C FORWARD -j "${CHAIN_FWD}" 2>/dev/null || iptables -t filter -I FORWARD -j "${CHAIN_FWD}"
  iptables -t filter -N "${CHAIN_IN}" 2>/dev/null || true
  iptables -t filter -F "${CHAIN_IN}"
  iptables -t filter -A "${CHAIN_IN}" -i lo -j RETURN
  iptables -t filter -A "${CHAIN_IN}" -i "${CLUSTER_BRIDGE}" -j RETURN
  iptables -t filter -A "${CHAIN_IN}" -p tcp -m multiport \
    --dports "${METAX_APISERVER_PORT},${METAX_REGISTRY_PORT},${METAX_REGISTRY_AUTH_PORT}" -j DROP
  iptables -t filter -C INPUT -j "${CHAIN_IN}" 2>/dev/null || iptables -t filter -I INPUT -j "${CHAIN_IN}"
}

# node_network_up INDEX NAME: namespace, veth, addresses, routes, CNI config.
node_network_up() {
  local i=$1 node=$2 ns veth d j
  ns=$(netns_of "${node}")
  veth=${VETH_PREFIX}${i}
  d=$(node_dir "${node}")/cni
  mkdir -p "${d}/net.d" "${d}/ipam"
  cat >"${d}/net.d/10-${CNI_NAME}.conflist" <<EOC
{
  "cniVersion": "0.4.0",
  "name": "${CNI_NAME}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${BRIDGE}",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${d}/ipam",
        "ranges": [[{"subnet": "$(pod_cidr "${i}")", "gateway": "$(pod_gw "${i}")"}]]
      }
    }
  ]
}
EOC
  [[ -e /run/netns/${ns} ]] || ip netns add "${ns}"
  if ! ip link show "${veth}" >/dev/null 2>&1; then
    ip link add "${veth}" type veth peer name eth0 netns "${ns}"
    ip link set "${veth}" master "${CLUSTER_BRIDGE}" up
    ip -n "${ns}" addr add "$(node_ip "${i}")/24" dev eth0
    ip -n "${ns}" link set eth0 up
    ip -n "${ns}" link set lo up
  fi
  ip netns exec "${ns}" sysctl -qw net.ipv4.ip_forward=1
  ip -n "${ns}" route replace default via "${HOST_IP}"
  ip route replace "$(pod_cidr "${i}")" via "$(node_ip "${i}")" dev "${CLUSTER_BRIDGE}"
  for j in "${NODE_IDX[@]}"; do
    ((j == i)) && continue
    ip -n "${ns}" route replace "$(pod_cidr "${j}")" via "$(node_ip "${j}")" dev eth0
  done
}

# node_ns_up NAME: a holder process in the node's network namespace and in a
# new mount namespace (slave: the host's later mounts show, the node's stay
# inside) where the node's own directories are bind-mounted at the standard
# paths, so one DaemonSet spec resolves hostPaths to each node's own
# device-plugin dir, pod-resources socket and simulated root. The node's
# containerd and kubelet are started inside with nsenter.
node_ns_up() {
  local node=$1 d r src dst
  d=$(node_dir "${node}")
  r=$(node_run "${node}")
  mkdir -p "${d}/kubelet" "${d}/cni-cache" "${d}/cdi-etc" "${r}/containerd" "${r}/cdi"
  # mount points on the machine (empty there)
  mkdir -p "${KUBELET_DIR}" "${METAX_SIM_ROOT}" /var/lib/cni /run/containerd /etc/cdi /run/cdi
  if ! running "ns-${node}"; then
    START_WRAP="nsenter --net=/run/netns/$(netns_of "${node}") unshare --mount --propagation slave --" \
      start "ns-${node}" /usr/bin/sleep infinity
    sleep 0.2
    running "ns-${node}" || die "node ${node}: cannot start its namespace holder (log ${LOGS}/ns-${node}.log)"
  fi
  while read -r src dst; do
    if [[ $(in_node "${node}" stat -c %d:%i "${dst}") != $(stat -c %d:%i "${src}") ]]; then
      in_node "${node}" mount --bind "${src}" "${dst}"
    fi
  done <<EOM
${d}/kubelet ${KUBELET_DIR}
$(sim_dir_of "${node}") ${METAX_SIM_ROOT}
${d}/cni-cache /var/lib/cni
${r}/containerd /run/containerd
${d}/cdi-etc /etc/cdi
${r}/cdi /run/cdi
EOM
}

# The first node's kubelet dir and simulated root also at the standard paths
# on the machine itself (what single-node tests and tools read). Made before
# any node namespace, which then inherits them.
host_binds_up() {
  local node=${NODE_NAMES[0]} src dst
  while read -r src dst; do
    mkdir -p "${src}" "${dst}"
    mountpoint -q "${dst}" || mount --bind "${src}" "${dst}"
  done <<EOM
$(node_dir "${node}")/kubelet ${KUBELET_DIR}
$(sim_dir_of "${node}") ${METAX_SIM_ROOT}
EOM
}

# Each kubelet gets its own cgroupRoot: two kubelets on one root remove each
# other's pod cgroups. The kubelet wants it to exist in every hierarchy.
node_cgroups_up() {
  local node=$1 c
  for c in /sys/fs/cgroup/*/; do
    [[ -f ${c}cgroup.procs ]] || continue
    mkdir -p "${c}${CGROUP_PREFIX}${node}"
  done
}

# ------------------------------------------------------------------ containerd
# Registry host config (containerd's config_path, shared by every node): the
# nodes reach the registries on the bridge address, by the names the images
# carry (127.0.0.1:5000/..., localhost:5000/..., 127.0.0.1:5443/...).
registry_hosts() {
  local d=${STATE}/containerd-certs.d a=${STATE}/registry-auth h
  for h in "${METAX_REGISTRY}" "localhost:${METAX_REGISTRY_PORT}" "${HOST_IP}:${METAX_REGISTRY_PORT}"; do
    mkdir -p "${d}/${h}"
    cat >"${d}/${h}/hosts.toml" <<EOT
server = "http://${HOST_IP}:${METAX_REGISTRY_PORT}"
[host."http://${HOST_IP}:${METAX_REGISTRY_PORT}"]
  capabilities = ["pull", "resolve"]
EOT
  done
  for h in "${METAX_REGISTRY_AUTH}" "${HOST_IP}:${METAX_REGISTRY_AUTH_PORT}"; do
    mkdir -p "${d}/${h}"
    cat >"${d}/${h}/hosts.toml" <<EOT
server = "https://${HOST_IP}:${METAX_REGISTRY_AUTH_PORT}"
[host."https://${HOST_IP}:${METAX_REGISTRY_AUTH_PORT}"]
  capabilities = ["pull", "resolve"]
  ca = "${a}/tls.crt"
EOT
  done
}

# containerd_up NAME: the node's own containerd 2 (root, state, socket), in
# the node's namespaces; CDI on with the standard spec dirs (the node's own,
# through its mount namespace).
containerd_up() {
  local node=$1 d r sock a=${STATE}/registry-auth pw
  d=$(node_dir "${node}")/containerd
  r=$(node_run "${node}")
  sock=$(sock_of "${node}")
  pw=$(cat "${a}/password")
  mkdir -p "${d}" "${r}"
  (
    umask 077
    cat >"${d}/config.toml" <<EOT
# Generated by scripts/cluster/cluster.sh: node ${node}'s containerd (own root,
# state and socket; the machine's containerd, if any, is untouched).
version = 3
root = "${d}/root"
state = "${r}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri"]

[grpc]
  address = "${sock}"

[ttrpc]
  address = "${sock}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "${d}/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "${METAX_PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "${STATE}/containerd-certs.d"
    # credentials (hosts.toml has no place for them; kubelet pull secrets win)
    [plugins."io.containerd.cri.v1.images".registry.configs."${METAX_REGISTRY_AUTH}".auth]
      username = "${METAX_REGISTRY_USER}"
      password = "${pw}"
    [plugins."io.containerd.cri.v1.images".registry.configs."${HOST_IP}:${METAX_REGISTRY_AUTH_PORT}".auth]
      username = "${METAX_REGISTRY_USER}"
      password = "${pw}"

[plugins."io.containerd.cri.v1.runtime"]
  # root cannot lower oom_score_adj on these machines (no CAP_SYS_RESOURCE in
  # the bounding set): without this every sandbox fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "${r}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$(node_dir "${node}")/cni/net.d"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
EOT
  )
  START_WRAP="nsenter -t $(pid_of "ns-${node}") -m -n --" START_CONFIG="${d}/config.toml" \
    start "containerd-${node}" "${CTRD_BIN}/containerd" --config "${d}/config.toml"
  wait_for "containerd of ${node} (${sock})" 60 "containerd-${node}" "${CTRD_BIN}/ctr" --address "${sock}" version
  # Images the node needs without any pull: the pod sandbox (and the
  # scheduler on the control-plane node).
  local img archive want=("${METAX_PAUSE_IMAGE}") have
  for img in pause scheduler; do
    [[ ${img} == scheduler && ${node} != "${NODE_NAMES[0]}" ]] && continue
    archive=$("${CLUSTER_SCRIPTS}/images.sh" archive "${img}")
    ctr_node "${node}" images import "${archive}" >/dev/null ||
      die "importing ${archive} into the containerd of ${node} failed"
  done
  [[ ${node} == "${NODE_NAMES[0]}" ]] && want+=("${METAX_SCHEDULER_IMAGE}")
  have=$(ctr_node "${node}" images ls -q)
  for img in "${want[@]}"; do
    grep -qxF "${img}" <<<"${have}" || die "the image ${img} is not in the containerd of ${node} after import"
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
    --bind-address=0.0.0.0 --advertise-address="${HOST_IP}" --secure-port="${METAX_APISERVER_PORT}" \
    --etcd-servers="http://127.0.0.1:${METAX_ETCD_PORT}" \
    --endpoint-reconciler-type=lease \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --client-ca-file="${PKI}/ca.crt" \
    --tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
    --kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
    --kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="${PKI}/ca.crt" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
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

kubelet_up() { # INDEX NAME
  local i=$1 node=$2 d ip static=""
  d=$(node_dir "${node}")
  ip=$(node_ip "${i}")
  mkdir -p "${d}/pod-logs"
  touch "${d}/kubelet/${MARKER_NAME}"
  # the control-plane node runs the static pods of the machine's manifests dir
  ((i == 1)) && static="staticPodPath: ${MANIFESTS}"
  cat >"${d}/kubelet-config.yaml" <<EOK
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${ip}
port: ${METAX_KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: ${ip}
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
tlsCertFile: ${PKI}/kubelet-${node}.crt
tlsPrivateKeyFile: ${PKI}/kubelet-${node}.key
rotateCertificates: false
serverTLSBootstrap: false
cgroupDriver: cgroupfs
cgroupRoot: $(cgroup_root_of "${node}")
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(sock_of "${node}")
imageServiceEndpoint: unix://$(sock_of "${node}")
${static}
podLogsDir: ${d}/pod-logs
podCIDR: $(pod_cidr "${i}")
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
EOK
  START_WRAP="nsenter -t $(pid_of "ns-${node}") -m -n --" START_CONFIG="${d}/kubelet-config.yaml" \
    start "kubelet-${node}" "${BIN}/kubelet" --config="${d}/kubelet-config.yaml" \
    --kubeconfig="${d}/kubelet.conf" --hostname-override="${node}" --node-ip="${ip}" \
    --root-dir="${KUBELET_DIR}" --v=1
  wait_for "kubelet of ${node} /healthz" 120 "kubelet-${node}" \
    curl -fsS --max-time 2 "http://${ip}:${KUBELET_HEALTHZ_PORT}/healthz"
}

# kube_proxy_up INDEX NAME: kube-proxy (iptables mode) in the node's network
# namespace, so Service ClusterIPs work from pods and hostNetwork pods (the
# static kube-scheduler reaches an extender through its Service) as on a real
# cluster. masqueradeAll: without br_netfilter (not loaded on these VMs) a
# reply between two pods of one bridge would bypass the un-DNAT.
kube_proxy_up() {
  local i=$1 node=$2 d ip
  d=$(node_dir "${node}")
  ip=$(node_ip "${i}")
  # kube-proxy exits when its configuration file is written to, even with the
  # same content: a reuse run must leave an unchanged file untouched.
  cat >"${d}/.kube-proxy.yaml.new" <<EOK
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${STATE}/kube-proxy.conf
mode: iptables
hostnameOverride: ${node}
clusterCIDR: 10.244.0.0/16
bindAddress: ${ip}
healthzBindAddress: ${ip}:${KUBE_PROXY_HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["primary"]
iptables:
  masqueradeAll: true
# conntrack sysctls are left as the kernel has them (per-namespace limits)
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
# root cannot lower oom_score_adj on these machines
oomScoreAdj: 0
EOK
  if cmp -s "${d}/.kube-proxy.yaml.new" "${d}/kube-proxy.yaml"; then
    rm -f "${d}/.kube-proxy.yaml.new"
  else
    mv "${d}/.kube-proxy.yaml.new" "${d}/kube-proxy.yaml"
  fi
  START_WRAP="nsenter -t $(pid_of "ns-${node}") -m -n --" START_CONFIG="${d}/kube-proxy.yaml" \
    start "kube-proxy-${node}" "${BIN}/kube-proxy" --config="${d}/kube-proxy.yaml" --v=1
}

kube_proxy_ready() { # INDEX
  curl -fsS --max-time 2 "http://$(node_ip "$1"):${KUBE_PROXY_HEALTHZ_PORT}/healthz" >/dev/null
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
  local node=${NODE_NAMES[0]} i names=() rows=()
  for i in "${!NODE_NAMES[@]}"; do
    names+=("${NODE_NAMES[$i]}")
    rows+=("${NODE_IDX[$i]} ${NODE_NAMES[$i]} ${NODE_PRESETS[$i]} $(sim_dir_of "${NODE_NAMES[$i]}") $(node_ip "${NODE_IDX[$i]}") $(pod_cidr "${NODE_IDX[$i]}") $(sock_of "${NODE_NAMES[$i]}") $(node_dir "${NODE_NAMES[$i]}")/kubelet $(netns_of "${NODE_NAMES[$i]}")")
  done
  cat >"${STATE}/cluster.env" <<EOF
export KUBECONFIG=${ADMIN_CONF}
export METAX_KUBE_BIN=${BIN}
export METAX_NODE_NAME=${node}
export METAX_NODES="${names[*]}"
export METAX_NODES_FILE=${STATE}/nodes.json
export METAX_APISERVER=${APISERVER}
export METAX_APISERVER_NODES=${APISERVER_NODES}
export METAX_REGISTRY=${METAX_REGISTRY}
export METAX_REGISTRY_AUTH=${METAX_REGISTRY_AUTH}
export METAX_REGISTRY_AUTH_USER=${METAX_REGISTRY_USER}
export METAX_REGISTRY_AUTH_PASSWORD_FILE=${STATE}/registry-auth/password
export METAX_REGISTRY_AUTH_CA=${STATE}/registry-auth/tls.crt
export METAX_REGISTRY_AUTH_CERT_DIR=${STATE}/registry-auth/certs.d/${METAX_REGISTRY_AUTH}
export METAX_SIM_ROOT=${METAX_SIM_ROOT}
export METAX_SIM_PRESET=${NODE_PRESETS[0]}
export METAX_CONTAINERD_ADDRESS=$(sock_of "${node}")
export METAX_CONTAINERD_BIN=${CTRD_BIN}
export METAX_PAUSE_IMAGE=${METAX_PAUSE_IMAGE}
export METAX_SCHEDULER_IMAGE=${METAX_SCHEDULER_IMAGE}
export METAX_BASE_IMAGE=${METAX_BASE_IMAGE}
export METAX_REGISTRY_BASE_IMAGE=${METAX_REGISTRY}/metax-gpu/base:${METAX_BASE_SUITE}
export METAX_HELM=${HELM_BIN}/helm
export HELM_PLUGINS=$(helm_plugins_dir)
export CONTAINERS_CONF=${CONTAINERS_CONF}
export CONTAINERS_REGISTRIES_CONF=${CONTAINERS_REGISTRIES_CONF}
export PATH=${BIN}:${HELM_BIN}:${CTRD_BIN}:\${PATH}
EOF
  printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
keys = ["index", "name", "preset", "sim_root", "ip", "pod_cidr", "containerd_address", "kubelet_dir", "netns"]
nodes = [dict(zip(keys, line.split())) for line in sys.stdin if line.strip()]
for n in nodes:
    n["index"] = int(n["index"])
    n["control_plane"] = n["index"] == 1
print(json.dumps(nodes, indent=2))' >"${STATE}/nodes.json"
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
keys = ["KUBECONFIG", "METAX_KUBE_BIN", "METAX_NODE_NAME", "METAX_APISERVER", "METAX_APISERVER_NODES",
        "METAX_REGISTRY", "METAX_REGISTRY_AUTH", "METAX_REGISTRY_AUTH_USER", "METAX_REGISTRY_AUTH_PASSWORD_FILE",
        "METAX_REGISTRY_AUTH_CA", "METAX_REGISTRY_AUTH_CERT_DIR", "METAX_SIM_ROOT", "METAX_SIM_PRESET",
        "METAX_CONTAINERD_ADDRESS", "METAX_CONTAINERD_BIN", "METAX_PAUSE_IMAGE", "METAX_SCHEDULER_IMAGE",
        "METAX_BASE_IMAGE", "METAX_REGISTRY_BASE_IMAGE", "METAX_HELM", "HELM_PLUGINS", "CONTAINERS_CONF",
        "CONTAINERS_REGISTRIES_CONF"]
info = {k: os.environ.get(k, "") for k in keys}
with open(os.environ["METAX_NODES_FILE"]) as fh:
    info["nodes"] = json.load(fh)
print(json.dumps(info, indent=2, sort_keys=True))
PY
  )
}

# inventory: an Ansible YAML inventory of the running cluster (the
# collection's conventions: docs/local-cluster.md).
cmd_inventory() {
  [[ -f ${STATE}/nodes.json ]] || die "no cluster state in ${STATE}: run 'make cluster-up' first"
  localcluster inventory "${STATE}/nodes.json" "${ADMIN_CONF}"
}

# ------------------------------------------------------------------ up
# node_up INDEX NAME PRESET: everything of one GPU node, up to Ready.
node_up() {
  local i=$1 node=$2 preset=$3
  make_sim_root "${node}" "${preset}"
  node_network_up "${i}" "${node}"
  node_cgroups_up "${node}"
  node_ns_up "${node}"
  containerd_up "${node}"
  kubelet_up "${i}" "${node}"
  kube_proxy_up "${i}" "${node}"
}

cmd_up() {
  require_root
  local i node first planned
  # the project's one dependency list (requirements/system.txt): Debian
  # packages, the Kubernetes, containerd and helm builds, the base image
  phase_start "deps (requirements/system.txt)"
  "${REPO_ROOT}/scripts/deps.sh"
  phase_start "preflight"
  planned=$(plan_nodes)
  [[ -n ${planned} ]] || die "NODES is empty: give one preset per node, e.g. NODES=\"8xC500 4xN100\""
  ensure_collection_path
  "$(project_python)" - "${NODES}" <<'PY' || die "NODES=\"${NODES}\": unknown preset (see above)"
import sys
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import PRESETS
bad = [p for p in sys.argv[1].split() if p not in PRESETS]
if bad:
    sys.exit("unknown simulated node preset(s) %s; known: %s" % (" ".join(bad), " ".join(sorted(PRESETS))))
PY
  # a cluster started by another checkout, other cluster scripts or with
  # other nodes is never reused silently (scripts/cluster/identity.py)
  # what decides how the cluster is built: these scripts and the package they run
  local verdict CLUSTER_SOURCES=${CLUSTER_SCRIPTS}:${REPO_ROOT}/tests/localcluster
  verdict=$(python3 "${CLUSTER_SCRIPTS}/identity.py" check "${STATE}/identity.json" "${REPO_ROOT}" "${CLUSTER_SOURCES}" "${NODES}")
  case ${verdict} in
    replace*)
      warn "replacing the running cluster: ${verdict#replace: }"
      NODES='' METAX_CLUSTER_LOCK_HELD=1 bash "${CLUSTER_SCRIPTS}/cluster.sh" down ||
        die "could not take the running cluster down"
      ;;
    reuse:*) warn "reusing the running cluster: ${verdict#reuse: }" ;;
  esac
  preflight
  mkdir -p "${STATE}" "${LOGS}" "${PIDS}"
  chmod 700 "${STATE}"
  record_baseline
  mkdir -p "${RUN}"
  echo "${planned}" >"${STATE}/node-table"
  python3 "${CLUSTER_SCRIPTS}/identity.py" record "${STATE}/identity.json" "${REPO_ROOT}" "${CLUSTER_SOURCES}" "${NODES}"
  load_nodes
  first=${NODE_NAMES[0]}
  echo "${first}" >"${STATE}/node-name"
  log "nodes: $(awk '{print $2 " (" $3 ")"}' "${STATE}/node-table" | xargs)"
  phase_start "pki + kubeconfigs"
  make_pki
  phase_start "registries"
  registries
  registry_hosts
  phase_start "images (build + push)"
  "${CLUSTER_SCRIPTS}/images.sh" build
  "${CLUSTER_SCRIPTS}/images.sh" push
  phase_start "network (bridge, service ip)"
  network_up
  phase_start "etcd"
  etcd_up
  phase_start "kube-apiserver"
  apiserver_up
  phase_start "kube-controller-manager"
  controller_manager_up
  scheduler_manifest
  make_sim_root "${first}" "${NODE_PRESETS[0]}"
  host_binds_up
  for i in "${!NODE_NAMES[@]}"; do
    phase_start "node ${NODE_NAMES[$i]} (${NODE_PRESETS[$i]})"
    node_up "${NODE_IDX[$i]}" "${NODE_NAMES[$i]}" "${NODE_PRESETS[$i]}"
  done
  # single-node tools read the first kubelet's config at the old path
  mkdir -p "${STATE}/kubelet"
  ln -sfn "$(node_dir "${first}")/kubelet-config.yaml" "${STATE}/kubelet/config.yaml"
  phase_start "nodes Ready + static kube-scheduler"
  for node in "${NODE_NAMES[@]}"; do
    wait_for "node ${node} Ready" 180 "kubelet-${node}" node_ready "${node}"
  done
  kubectl label node "${first}" --overwrite node-role.kubernetes.io/control-plane= >/dev/null
  for i in "${NODE_IDX[@]}"; do
    wait_for "kube-proxy of node ${i} /healthz" 60 "kube-proxy-$(awk -v i="${i}" '$1 == i {print $2}' "${STATE}/node-table")" \
      kube_proxy_ready "${i}"
  done
  # what the node IPAM controller would record (the CNI config already uses it)
  for i in "${!NODE_NAMES[@]}"; do
    node=${NODE_NAMES[$i]}
    if [[ -z $(kubectl get node "${node}" -o jsonpath='{.spec.podCIDR}') ]]; then
      kubectl patch node "${node}" --type merge \
        -p "{\"spec\":{\"podCIDR\":\"$(pod_cidr "${NODE_IDX[$i]}")\",\"podCIDRs\":[\"$(pod_cidr "${NODE_IDX[$i]}")\"]}}" >/dev/null
    fi
  done
  wait_for "static pod kube-system/kube-scheduler-${first} Ready" 180 "kubelet-${first}" scheduler_ready "${first}"
  wait_for "default ServiceAccount" 60 kube-controller-manager default_sa
  write_env
  phase_report "cluster up"
  cmd_status
}

# restart-kubelet [NODE]: what a kubelet upgrade or crash does to device
# plugins (kubelet.sock recreated, plugin sockets removed), for tests and
# demos. Default: the first node.
cmd_restart_kubelet() {
  require_root
  load_nodes || die "no cluster recorded in ${STATE}; start it first: make cluster-up"
  local target=${1:-${NODE_NAMES[0]}} i
  for i in "${!NODE_NAMES[@]}"; do
    [[ ${NODE_NAMES[$i]} == "${target}" ]] || continue
    running "kubelet-${target}" || die "the kubelet of ${target} is not running; start the cluster first: make cluster-up"
    stop "kubelet-${target}"
    kubelet_up "${NODE_IDX[$i]}" "${target}"
    wait_for "node ${target} Ready" 120 "kubelet-${target}" node_ready "${target}"
    log "kubelet of ${target} restarted"
    return 0
  done
  die "no node ${target} in this cluster (nodes: ${NODE_NAMES[*]})"
}

# ------------------------------------------------------------------ status
cmd_status() {
  local c ok=0 total=0 i node comps=(etcd kube-apiserver kube-controller-manager registry registry-auth)
  if [[ ! -d ${STATE} ]]; then
    echo "cluster: down (no state in ${STATE})"
    return 3
  fi
  load_nodes || true
  for node in "${NODE_NAMES[@]}"; do comps+=("ns-${node}" "containerd-${node}" "kubelet-${node}" "kube-proxy-${node}"); done
  echo "cluster state: ${STATE}"
  for c in "${comps[@]}"; do
    total=$((total + 1))
    if running "${c}"; then
      ok=$((ok + 1))
      printf '  %-34s running (pid %s)\n' "${c}" "$(pid_of "${c}")"
    elif [[ -f ${PIDS}/${c}.pid ]]; then
      printf '  %-34s NOT RUNNING (stale PID file %s)\n' "${c}" "$(pid_of "${c}")"
    else
      printf '  %-34s stopped\n' "${c}"
    fi
  done
  cat <<EOF
kubeconfig (admin):   ${ADMIN_CONF}
apiserver:            ${APISERVER} (nodes: ${APISERVER_NODES})
kubectl:              ${BIN}/kubectl
helm:                 ${HELM_BIN}/helm (HELM_PLUGINS=$(helm_plugins_dir))
registry (http):      ${METAX_REGISTRY}
registry (tls+auth):  ${METAX_REGISTRY_AUTH}  user ${METAX_REGISTRY_USER}, password in ${STATE}/registry-auth/password, CA ${STATE}/registry-auth/tls.crt
static pod manifests: ${MANIFESTS}
logs:                 ${LOGS}
use it:               eval "\$(scripts/cluster/cluster.sh env)"; scripts/cluster/cluster.sh inventory
nodes (name, preset, simulated root, node IP, pod CIDR, containerd socket):
EOF
  for i in "${!NODE_NAMES[@]}"; do
    node=${NODE_NAMES[$i]}
    printf '  %-22s %-13s %-36s %-12s %-15s %s%s\n' "${node}" "${NODE_PRESETS[$i]}" "$(sim_dir_of "${node}")" \
      "$(node_ip "${NODE_IDX[$i]}")" "$(pod_cidr "${NODE_IDX[$i]}")" "$(sock_of "${node}")" \
      "$( ((i == 0)) && echo "  control plane")"
  done
  echo "  (inside every node its own simulated root is at ${METAX_SIM_ROOT}, its kubelet dir at ${KUBELET_DIR})"
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
  # Let the kubelets tear pods down properly (CNI DEL, volume unmounts) while
  # they and the apiserver still run: static pods by removing the manifests we
  # put there, other pods by force deletion.
  local node any=0
  for node in "${NODE_NAMES[@]}"; do running "kubelet-${node}" && any=1; done
  ((any)) && running kube-apiserver && [[ -f ${ADMIN_CONF} ]] || return 0
  log "removing pods (the kubelets tear down sandboxes, networks and volumes)"
  mkdir -p "${STATE}/manifests-removed"
  local f rel
  while IFS= read -r f; do
    rel=${f#"${ETC}"/}
    grep -qxF "./${rel}" "${BASELINE}/etc-files" 2>/dev/null && continue
    mv "${f}" "${STATE}/manifests-removed/" 2>/dev/null || true
  done < <(find "${MANIFESTS}" -mindepth 1 -maxdepth 1 -type f 2>/dev/null)
  kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  local t0 left
  t0=$(date +%s)
  while (($(date +%s) - t0 < 45)); do
    left=""
    for node in "${NODE_NAMES[@]}"; do
      running "containerd-${node}" && left+=$(ctr_node "${node}" tasks ls -q 2>/dev/null)
    done
    [[ -z ${left} ]] && break
    sleep 1
  done
  # the kubelet removes stopped sandboxes lazily; stopping them is enough
}

kill_containers() { # NODE
  # Whatever still runs in the node's containerd: kill tasks, delete
  # containers (their shims exit with them).
  local node=$1 id
  running "containerd-${node}" || return 0
  for id in $(ctr_node "${node}" tasks ls -q 2>/dev/null); do
    ctr_node "${node}" tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true
  done
  sleep 1
  for id in $(ctr_node "${node}" tasks ls -q 2>/dev/null); do
    ctr_node "${node}" tasks delete -f "${id}" >/dev/null 2>&1 || true
  done
  for id in $(ctr_node "${node}" containers ls -q 2>/dev/null); do
    ctr_node "${node}" containers delete "${id}" >/dev/null 2>&1 || true
  done
}

# kill_node_leftovers NODE: every process still in the node's network
# namespace or under its cgroupRoot (shims, container processes) is ours.
kill_node_leftovers() {
  local node=$1 pids pid c found=0
  pids=$(ip netns pids "$(netns_of "${node}")" 2>/dev/null || true)
  for c in /sys/fs/cgroup/*/"${CGROUP_PREFIX}${node}"; do
    [[ -d ${c} ]] || continue
    pids+=" $(find "${c}" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
  done
  for pid in ${pids}; do
    [[ ${pid} == "$(pid_of "ns-${node}" 2>/dev/null)" ]] && continue
    kill -KILL "${pid}" 2>/dev/null && found=1
  done
  if ((found)); then
    warn "killed leftover processes of node ${node}"
    sleep 0.5
  fi
}

remove_netns() {
  local n
  [[ -d /run/netns ]] || return 0
  for n in /run/netns/cni-* /run/netns/"${NETNS_PREFIX}"*; do
    [[ -e ${n} ]] || continue
    n=${n##*/}
    grep -qxF "${n}" "${BASELINE}/netns" 2>/dev/null && continue
    ip netns delete "${n}" 2>/dev/null || {
      umount "/run/netns/${n}" 2>/dev/null || umount -l "/run/netns/${n}" 2>/dev/null || true
      rm -f "/run/netns/${n}"
    }
  done
  if ! existed_before /run/netns && [[ -d /run/netns ]] && [[ -z $(ls -A /run/netns) ]]; then
    # /run/netns is made a shared bind mount of itself by ip-netns/containerd
    umount /run/netns 2>/dev/null || true
    rmdir /run/netns 2>/dev/null || true
  fi
}

# sweep_own_leftovers: what a cluster killed without `down` (its state dir
# gone, e.g. removed by an older generation of this script) leaves behind
# that carries our names: node namespaces and their processes, our veths and
# bridge, our iptables chains. Without a baseline nothing else (KUBE-*/CNI-*
# chains, cgroups) is touched: it might not be ours.
sweep_own_leftovers() {
  local n pid link tool t chain line found=0
  for n in /run/netns/"${NETNS_PREFIX}"*; do
    [[ -e ${n} ]] || continue
    n=${n##*/}
    found=1
    for pid in $(ip netns pids "${n}" 2>/dev/null || true); do kill -KILL "${pid}" 2>/dev/null || true; done
    ip netns delete "${n}" 2>/dev/null || { umount -l "/run/netns/${n}" 2>/dev/null || true; rm -f "/run/netns/${n}"; }
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${VETH_PREFIX}[0-9]" || true); do
    found=1
    ip link delete "${link}" 2>/dev/null || true
  done
  if ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1; then
    found=1
    ip link delete "${CLUSTER_BRIDGE}" 2>/dev/null || true
  fi
  for tool in iptables ip6tables; do
    command -v "${tool}" >/dev/null || continue
    for t in filter nat mangle raw; do
      for chain in $("${tool}" -t "${t}" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^METAX-GPU-CLUSTER/ {print $2}'); do
        found=1
        while IFS= read -r line; do
          # shellcheck disable=SC2086
          "${tool}" -t "${t}" ${line/-A/-D} 2>/dev/null || true
        done < <("${tool}" -t "${t}" -S 2>/dev/null | grep -E -- "^-A .* -j ${chain}( |$)" || true)
        "${tool}" -t "${t}" -F "${chain}" 2>/dev/null || true
        "${tool}" -t "${t}" -X "${chain}" 2>/dev/null || true
      done
    done
  done
  if ((found)); then warn "removed leftovers of a cluster that was not taken down (namespaces, links, chains named ours)"; fi
  return 0
}

remove_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/"${CGROUP_PREFIX}"*; do
    [[ -d ${d} ]] || continue
    grep -qxF "${d}" "${BASELINE}/cgroups" 2>/dev/null && continue
    find "${d}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ -d ${d} ]] && warn "cgroup ${d} could not be removed (processes left in it?)"
  done
  return 0
}

network_down() {
  local t tool chain line link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${VETH_PREFIX}[0-9]" || true); do
    ip link delete "${link}" 2>/dev/null || true
  done
  if ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1; then ip link delete "${CLUSTER_BRIDGE}" 2>/dev/null || true; fi
  # the single-node cluster of before had its pod bridge on the host
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
  return 0
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
    sweep_own_leftovers
    log "cluster is down (nothing recorded in ${STATE})"
    return 0
  fi
  load_nodes || true
  # make demo's Prometheus (scripts/demo_metrics.py) records itself here
  stop demo-prometheus
  phase_start "drain pods"
  # no controller may recreate what is drained
  stop kube-controller-manager
  drain_pods
  phase_start "stop kubelets"
  local node
  for node in "${NODE_NAMES[@]}"; do
    stop "kubelet-${node}"
    stop "kube-proxy-${node}"
  done
  stop kubelet # a cluster of the single-node generation
  phase_start "stop containers + containerd"
  for node in "${NODE_NAMES[@]}"; do kill_containers "${node}"; done
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  for node in "${NODE_NAMES[@]}"; do
    stop "containerd-${node}"
    kill_node_leftovers "${node}"
    stop "ns-${node}"
  done
  stop containerd
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
  for p in /var/log/pods /var/log/containers /var/lib/cni "${SIM_PARENT}" "${RUN}" /etc/cdi /run/cdi; do
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
    # METAX_CLUSTER_LOCK_HELD: `up` replacing a foreign cluster runs `down`
    # while it holds the lock (fd 8, inherited)
    if [[ -z ${METAX_CLUSTER_LOCK_HELD:-} ]]; then
      exec 8>"${METAX_CACHE_DIR}/cluster.lock"
      flock -n 8 || { log "another cluster.sh up/down is running; waiting for it"; flock 8; }
    fi
    "cmd_${1//-/_}" "${@:2}"
    ;;
  status) cmd_status ;;
  inventory) cmd_inventory ;;
  env) cmd_env ;;
  podman-env)
    # usable without a cluster (Molecule, image builds)
    printf 'export CONTAINERS_CONF=%s\nexport CONTAINERS_REGISTRIES_CONF=%s\n' \
      "${CONTAINERS_CONF}" "${CONTAINERS_REGISTRIES_CONF}"
    ;;
  json) cmd_json ;;
  plan) plan_nodes ;;
  *)
    echo "usage: $0 up|down|status|restart-kubelet [NODE]|env|json|inventory|podman-env|plan" >&2
    exit 2
    ;;
esac
