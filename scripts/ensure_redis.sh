#!/usr/bin/env bash
# Make sure a Redis answers at RAGLINE_CACHE_REDIS_URL (default 127.0.0.1:6379); if nothing
# listens there and the host is this machine, start Debian's redis-server there (installing
# it if needed), with no persistence. A Redis that asks for a password counts as answering
# (ragline sends the URL's); a port held by something else is an error, never taken over.
set -euo pipefail
url=${RAGLINE_CACHE_REDIS_URL:-redis://127.0.0.1:6379/0}
scheme=${url%%://*}
hostport=${url#*://}; hostport=${hostport%%/*}; userinfo=""
[[ "$hostport" == *@* ]] && userinfo=${hostport%@*}  # up to the last @: a password may hold one
hostport=${hostport##*@}; hostport=${hostport%%/*}; hostport=${hostport%%\?*}
if [[ "$hostport" == \[*\]* ]]; then  # [::1]:6379
  host=${hostport#\[}; host=${host%%\]*}; rest=${hostport#*\]}; port=${rest#:}
else
  host=${hostport%%:*}; port=${hostport##*:}
  [ "$port" = "$hostport" ] && port=""
fi
host=${host:-127.0.0.1}; port=${port:-6379}
if [[ "$scheme" != redis && "$scheme" != rediss ]]; then
  echo "redis: $scheme:// URLs are not checked here (RAGLINE_CACHE_REDIS_URL); ragline connects itself"
  exit 0
fi
if ! [[ "$port" =~ ^[0-9]{1,5}$ ]]; then
  echo "redis: RAGLINE_CACHE_REDIS_URL ($scheme://$hostport): no port number in it" >&2
  exit 1
fi

# 0: a Redis answers (PONG, or an error such as NOAUTH: one asking for a password);
# 1: nothing listens; 2: something listens that does not answer as Redis does.
ping() {
  { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || return 1
  if [ "$scheme" = rediss ]; then  # TLS: bash cannot speak it; a listener is taken as Redis
    exec 3<&- 3>&-
    return 0
  fi
  printf 'PING\r\n' >&3
  local line=""
  read -r -t 2 line <&3 || true
  exec 3<&- 3>&-
  [[ "$line" == "+PONG"* || "$line" == "-NOAUTH"* || "$line" == "-ERR"* || "$line" == "-WRONGPASS"* ]] && return 0
  return 2
}

status=0
ping || status=$?
case $status in
  0) echo "redis: answering at $host:$port"; exit 0 ;;
  2) echo "redis: something listens at $host:$port that does not answer as Redis does;" \
       "free the port or point RAGLINE_CACHE_REDIS_URL at a Redis" >&2
     exit 1 ;;
esac
case "$host" in
  127.*|localhost|::1) ;;
  *) echo "redis: nothing answers at $host:$port and it is not local; not starting one" >&2
     exit 1 ;;
esac
if [ "$scheme" = rediss ]; then
  echo "redis: nothing answers at $host:$port; a TLS Redis (rediss://) is not started here" >&2
  exit 1
fi
if ! command -v redis-server >/dev/null; then
  echo "redis: installing Debian's redis-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p var
user=${userinfo%%:*}
if [[ -n "$user" && "$user" != default ]]; then
  echo "redis: RAGLINE_CACHE_REDIS_URL names the user '$user'; a Redis started here has only" \
    "the default one: use redis://:PASSWORD@$hostport, or start your own Redis" >&2
  exit 1
fi
# The configuration goes in on standard input (`redis-server -`), never on a command line
# another user's `ps` shows: a password in the URL (percent-encoded there, decoded as
# redis-py decodes it: urllib.parse.unquote, a % without two hex digits stays) is written
# byte by byte as \xHH in a quoted string, so no character of it can end the line.
password=""
[[ "$userinfo" == *:* ]] && password=${userinfo#*:}
RAGLINE_REDIS_PASSWORD=$password python3 -c '
import os, urllib.parse
p = urllib.parse.unquote(os.environ["RAGLINE_REDIS_PASSWORD"]).encode()
if p:
    print("requirepass \"" + "".join(f"\\x{b:02x}" for b in p) + "\"")
' | redis-server - --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --dir "$(pwd)/var" --logfile "$(pwd)/var/redis.log"
for _ in $(seq 1 50); do
  if ping; then echo "redis: started at $host:$port"; exit 0; fi
  sleep 0.1
done
echo "redis: failed to start at $host:$port; see var/redis.log" >&2
exit 1
