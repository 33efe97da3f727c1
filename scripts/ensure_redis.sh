#!/usr/bin/env bash
# Make sure a Redis answers at RAGLINE_CACHE_REDIS_URL (default 127.0.0.1:6379); if none does,
# start Debian's redis-server there (installing it if needed), with no persistence.
set -euo pipefail
url=${RAGLINE_CACHE_REDIS_URL:-redis://127.0.0.1:6379/0}
hostport=${url#*://}; hostport=${hostport#*@}; hostport=${hostport%%/*}
host=${hostport%%:*}; port=${hostport##*:}
[ "$port" = "$hostport" ] && port=6379

ping() {
  exec 3<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  local line=""
  read -r -t 2 line <&3 || true
  exec 3<&- 3>&-
  [[ "$line" == "+PONG"* ]]
}

if ping; then
  echo "redis: answering at $host:$port"
  exit 0
fi
case "$host" in
  127.*|localhost) ;;
  *) echo "redis: nothing answers at $host:$port and it is not local; not starting one" >&2
     exit 1 ;;
esac
if ! command -v redis-server >/dev/null; then
  echo "redis: installing Debian's redis-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p var
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --dir "$(pwd)/var" --logfile "$(pwd)/var/redis.log"
for _ in $(seq 1 50); do
  ping && { echo "redis: started at $host:$port"; exit 0; }
  sleep 0.1
done
echo "redis: failed to start; see var/redis.log" >&2
exit 1
