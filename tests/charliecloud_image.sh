#!/bin/bash
# Build the Charliecloud test image (a directory image) unless it is already there; print its path.
#
#   tests/charliecloud_image.sh [DEST]
#
# DEST defaults to $BERT_SQUAD_CH_IMAGE, else ${XDG_CACHE_HOME:-$HOME/.cache}/bert-squad/ch-bookworm: outside
# the checkout, so every checkout and test run on this machine shares one build. The image is Debian 12
# minbase from the Debian mirror (DEBIAN_MIRROR, default deb.debian.org) plus the shared libraries the
# host's Python and its extension modules load and procps; Python itself, the venv, the checkout and the
# scratch are bound in by the tests, not installed. It is built in a temporary folder beside DEST and
# renamed into place, so an interrupted build never leaves a half image at DEST; a lock keeps two test
# sessions from building at once. Needs root (debootstrap) and network access to the mirror.
set -euo pipefail

die() { echo "charliecloud_image: error: $*" >&2; exit 2; }

DEST=${1:-${BERT_SQUAD_CH_IMAGE:-${XDG_CACHE_HOME:-$HOME/.cache}/bert-squad/ch-bookworm}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What only this image has: the tests check it from inside each rank (the host has no such file).
# VERSION: raise it when the recipe below changes, and an image built by an older recipe is rebuilt.
MARKER=etc/bert-squad-ch-test-image
VERSION=2
# bash and coreutils are in minbase; procps for ps/pgrep in the ranks; the rest are the libraries of
# the host's pyenv Python modules (ssl, ctypes, sqlite3, bz2, lzma, readline, curses, zlib, expat, uuid).
PACKAGES=procps,libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,libreadline8,libncursesw6,zlib1g,libexpat1,libuuid1

current() { grep -qs "^bert-squad Charliecloud test image v$VERSION:" "$DEST/$MARKER"; }
if current; then
  echo "$DEST"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "building $DEST needs root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
# shellcheck source=tests/build_once.sh
source "$(dirname "$0")/build_once.sh"
build_once_start
[ ! -e "$DEST" ] || [ -f "$DEST/$MARKER" ] || die "$DEST exists but is not an image this script built (no /$MARKER): remove it"
echo "charliecloud_image: building $DEST (debootstrap bookworm from $MIRROR, a few minutes)" >&2
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$tmp/root" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 \
  || { tail -n 20 "$tmp/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
# ch-run binds the host's /etc/hosts and /etc/machine-id only onto files the image has; debootstrap makes
# neither, and without /etc/hosts the ranks cannot resolve MASTER_ADDR (torch's rendezvous then waits forever).
touch "$tmp/root/etc/hosts" "$tmp/root/etc/machine-id"
echo "bert-squad Charliecloud test image v$VERSION: Debian $(cat "$tmp/root/etc/debian_version") minbase" > "$tmp/root/$MARKER"
# An older version moves aside first (sessions that hard-linked it keep their copies), then the new one in.
[ ! -e "$DEST" ] || mv -T "$DEST" "$tmp/old"
mv -T "$tmp/root" "$DEST"
echo "$DEST"
