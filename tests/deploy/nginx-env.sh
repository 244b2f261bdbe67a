#!/usr/bin/env bash
# Sets up what tests/api/balancer.rs needs: Debian's nginx, to run the shipped
# deploy/compose/nginx.conf in front of gateway replicas. Idempotent and quick when nginx is
# there; installs it with apt-get when running as root; fails loudly otherwise.
#
#   tests/deploy/nginx-env.sh        # prints nginx's path on its last line
#   NGINX=/opt/nginx/sbin/nginx tests/deploy/nginx-env.sh    # another nginx
set -euo pipefail

NGINX="${NGINX:-/usr/sbin/nginx}"

die() { echo "nginx-env: ERROR: $*" >&2; exit 1; }

command -v flock >/dev/null || die "flock not found (util-linux)"
# One installer at a time (tests run in parallel, and so may several checkouts' tests).
exec 9>/tmp/a2a-gateway-nginx-env.lock
flock 9

if [ ! -x "$NGINX" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "nginx-env: installing Debian's nginx" >&2
        # The package's own service is not wanted here: policy-rc.d keeps apt from starting
        # it (the tests start nginx themselves, on ports of their own).
        policy=/usr/sbin/policy-rc.d
        made_policy=0
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\nexit 101\n' > "$policy"
            chmod 0755 "$policy"
            made_policy=1
        fi
        install() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx >&2
        }
        status=0
        install || { apt-get update >&2 && install; } || status=$?
        [ "$made_policy" = 1 ] && rm -f "$policy"
        [ "$status" = 0 ] || die "apt-get install nginx failed"
    else
        die "no nginx at $NGINX: install Debian's nginx (apt-get install nginx) or set NGINX"
    fi
fi
"$NGINX" -v 2>&1 | sed 's/^/nginx-env: /' >&2 || die "$NGINX does not start"
echo "$NGINX"
