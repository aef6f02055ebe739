#!/usr/bin/env bash
# The Docker engine and image for sandbox="docker", offline from Docker Hub.
#
#   scripts/docker-sandbox.sh engine   start dockerd in the background if no engine answers
#   scripts/docker-sandbox.sh image    the image: present, else loaded from the cache, else built
#   scripts/docker-sandbox.sh all      both (what `make test` runs)
#
# The image (RECURSA_DOCKER_IMAGE, default below) is a Debian minbase with python3 and procps,
# built by debootstrap from the mirror apt already uses (/etc/apt/sources.list*) and
# `docker import`ed: no registry is involved. The first build saves it with `docker save`
# under ~/.cache/recursa/docker, so the next machine state without it loads it in seconds.
# Building needs root (debootstrap) and the mirror; loading needs neither.
set -euo pipefail

IMAGE=${RECURSA_DOCKER_IMAGE:-recursa-sandbox:1}     # bump the tag when the recipe changes
CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/recursa/docker
CACHE=$CACHE_DIR/${IMAGE//[:\/]/_}.tar
DOCKERD_LOG=${RECURSA_DOCKERD_LOG:-/var/log/recursa-dockerd.log}
PACKAGES=python3,procps

say() { echo "docker-sandbox: $*" >&2; }

engine_answers() { [ -n "$(docker version --format '{{.Server.Version}}' 2>/dev/null)" ]; }

# dockerd without systemd. --iptables=false --bridge=none: the sandbox runs with --network none,
# and this daemon must not rewrite the host's firewall or add a bridge to start; the storage
# driver is dockerd's own choice (overlay2 where the kernel allows it, else vfs).
start_engine() {
    if engine_answers; then return 0; fi
    if ! command -v dockerd >/dev/null; then
        say "no Docker engine answers and dockerd is not installed (apt-get install docker.io)"
        return 1
    fi
    if [ "$(id -u)" != 0 ]; then
        say "no Docker engine answers; start one (as root: dockerd, or systemctl start docker)"
        return 1
    fi
    say "starting dockerd in the background (log: $DOCKERD_LOG; stop: kill \$(cat /var/run/docker.pid))"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    nohup dockerd --iptables=false --ip6tables=false --bridge=none \
        >>"$DOCKERD_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        if engine_answers; then return 0; fi
        if ! kill -0 $! 2>/dev/null; then break; fi
        sleep 0.25
    done
    say "dockerd did not answer within 30 s; the end of $DOCKERD_LOG:"
    tail -n 20 "$DOCKERD_LOG" >&2
    return 1
}

# The first Debian/Ubuntu mirror and suite apt uses (one-line or deb822 format).
apt_source() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    local found
    found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | awk -v c="$codename" '$1 == "deb" && $0 !~ /\[/ && $3 == c { print $2, $3; exit }' \
        || true)
    if [ -z "$found" ]; then
        found=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v c="$codename" '
            /^[[:space:]]*$/ { if (uri != "" && ok) { print uri, c; exit }; uri = ""; ok = 0 }
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == c) ok = 1 }
            END { if (uri != "" && ok) print uri, c }' | head -n 1 || true)
    fi
    echo "${RECURSA_DEBOOTSTRAP_MIRROR:-${found% *}} ${RECURSA_DEBOOTSTRAP_SUITE:-${found#* }}"
}

build_image() {
    if [ "$(id -u)" != 0 ]; then
        say "building $IMAGE needs root (debootstrap); run this script with sudo"
        return 1
    fi
    command -v debootstrap >/dev/null || { say "apt-get install debootstrap"; return 1; }
    local mirror suite
    read -r mirror suite < <(apt_source)
    if [ -z "$mirror" ] || [ -z "$suite" ]; then
        say "no Debian mirror found in /etc/apt/sources.list*;" \
            "set RECURSA_DEBOOTSTRAP_MIRROR and RECURSA_DEBOOTSTRAP_SUITE"
        return 1
    fi
    root=$(mktemp -d /var/tmp/recursa-rootfs.XXXXXX)
    trap 'rm -rf "$root" "$root.log"' EXIT
    say "building $IMAGE: debootstrap --variant=minbase $suite from $mirror (+ $PACKAGES)"
    debootstrap --variant=minbase --include="$PACKAGES" "$suite" "$root" "$mirror" \
        >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; return 1; }
    # what a sandbox never reads: package caches, documentation, translations
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar --numeric-owner -C "$root" -c . | docker import \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        --change "LABEL org.opencontainers.image.description=\"recursa sandbox: debootstrap minbase $suite + $PACKAGES\"" \
        - "$IMAGE" >/dev/null
    mkdir -p "$CACHE_DIR"
    docker save -o "$CACHE.part" "$IMAGE" && mv "$CACHE.part" "$CACHE"
    say "built $IMAGE; saved to $CACHE"
}

ensure_image() {
    if docker image inspect "$IMAGE" >/dev/null 2>&1; then return 0; fi
    if [ -f "$CACHE" ]; then
        say "loading $IMAGE from $CACHE"
        docker load -q -i "$CACHE" >/dev/null && return 0
        say "could not load $CACHE; building again"
    fi
    build_image
}

case "${1:-all}" in
    engine) start_engine ;;
    image) ensure_image ;;
    all) start_engine && ensure_image ;;
    *) echo "usage: $0 [engine|image|all]" >&2; exit 2 ;;
esac
