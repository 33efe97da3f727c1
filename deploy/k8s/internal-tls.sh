#!/usr/bin/env bash
# Certificates for mutual TLS between ragline's services in Kubernetes: a private CA, one
# server certificate for the stage Services (ragline-retriever, -credibility, -graph,
# -generator, under their short and cluster names) and one client certificate for their
# callers (the gateway and the graph role). Keys are EC P-256.
#
#   deploy/k8s/internal-tls.sh DIR [NAMESPACE] [DAYS]
#   (then the `kubectl create secret` line it prints: secret ragline-internal-tls)
#
# DIR gets ca.crt, server.crt, server.key, client.crt, client.key, and the CA's key ca.key,
# which the secret leaves out: keep it off the cluster, it signs the next certificates. NAMESPACE
# (default ragline) names the cluster DNS names; DAYS (default 365) is how long the leaf
# certificates last: make new ones before then and replace the secret (the pods pick the
# files up on their next restart).
set -euo pipefail

usage() { sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
if [[ $# -lt 1 || $# -gt 3 || "$1" == -h || "$1" == --help ]]; then
  usage
  [[ $# -ge 1 && ( "$1" == -h || "$1" == --help ) ]] && exit 0
  exit 2
fi
dir=$1 namespace=${2:-ragline} days=${3:-365}
[[ "$dir" == -* ]] && dir=./$dir  # a folder named like an option is still a folder
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || { echo "error: namespace '$namespace' is not a DNS label" >&2; exit 2; }
[[ "$days" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "error: days must be a whole number from 1 to 99999" >&2; exit 2; }
command -v openssl > /dev/null || { echo "error: needs the openssl command line" >&2; exit 2; }
if [[ -e "$dir/ca.key" ]]; then
  echo "error: $dir already holds a CA (ca.key): choose an empty folder" >&2
  exit 2
fi
mkdir -p -- "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
umask 077

sans="DNS:localhost"
for role in retriever credibility graph generator; do
  for name in "ragline-$role" "ragline-$role.$namespace" "ragline-$role.$namespace.svc" \
      "ragline-$role.$namespace.svc.cluster.local"; do
    sans="$sans,DNS:$name"
  done
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2> /dev/null; }

key "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -out "$tmp/ca.crt" -days $((days * 3)) \
  -subj "/CN=ragline-internal-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

leaf() {  # leaf NAME USAGE [SANS]
  key "$tmp/$1.key"
  openssl req -new -key "$tmp/$1.key" -out "$tmp/$1.csr" -subj "/CN=ragline-$1"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"  # EC keys: no keyEncipherment (RFC 5480)
    echo "extendedKeyUsage=$2"
    [[ -n "${3:-}" ]] && echo "subjectAltName=$3"
  } > "$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" \
    -out "$tmp/$1.crt" -days "$days" -set_serial "0x$(openssl rand -hex 8)" \
    -extfile "$tmp/$1.ext" 2> /dev/null
}
leaf server serverAuth "$sans"
leaf client clientAuth

chmod 644 "$tmp"/*.crt  # keys stay 600 here; the pods read them as group 10001 (defaultMode)
mv "$tmp"/*.crt "$tmp/server.key" "$tmp/client.key" "$tmp/ca.key" "$dir/"
echo "wrote $dir: ca.crt, server.crt/.key (stage services in namespace $namespace), client.crt/.key; ca.key signs the next ones"
q=$(printf '%q' "$dir")  # a folder with spaces still pastes as one argument
echo "next: kubectl -n $namespace create secret generic ragline-internal-tls \\"
echo "        --from-file=ca.crt=$q/ca.crt --from-file=server.crt=$q/server.crt --from-file=server.key=$q/server.key \\"
echo "        --from-file=client.crt=$q/client.crt --from-file=client.key=$q/client.key"
