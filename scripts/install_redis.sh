#!/usr/bin/env bash
# Make sure the redis-server binary exists; install Debian's package when it does not.
#
#   bash scripts/install_redis.sh
#
# Only the binary: nothing is started, now or at boot of the install (the plugin tests start their
# own server on a free loopback port and stop it by pid). Needs root, or sudo.
set -euo pipefail
log() { printf '[install_redis] %s\n' "$*" >&2; }

command -v redis-server >/dev/null 2>&1 && exit 0

start=$SECONDS
sudo=()
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { log "error: redis-server is missing and installing it needs root"; exit 1; }
  sudo=(sudo)
fi
# Debian's maintainer scripts start a service at install unless /usr/sbin/policy-rc.d forbids it:
# keep a policy that exists, else add one that refuses (exit 101) for the length of the install.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  added_policy=1
fi
log "installing redis-server with apt-get"
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq)
status=0
{ "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends redis-server; } >&2 </dev/null || status=$?
if ((added_policy)); then "${sudo[@]}" rm -f "$policy"; fi
if ((status != 0)); then
  log "error: apt-get install redis-server failed (exit $status)"
  exit "$status"
fi
if ! command -v redis-server >/dev/null 2>&1; then
  log "error: apt-get installed redis-server but it is not on PATH ($PATH)"
  exit 1
fi
log "redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') installed in $((SECONDS - start)) s"
