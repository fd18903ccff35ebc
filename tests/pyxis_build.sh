#!/bin/bash
# Build Enroot and Pyxis (tests/test_pyxis.py) unless they are already built; print the prefix.
#
#   tests/pyxis_build.sh [DEST]
#
# DEST defaults to $BERT_SQUAD_PYXIS, else ${XDG_CACHE_HOME:-$HOME/.cache}/bert-squad/pyxis: outside the
# checkout, so every checkout and test run on this machine shares one build (as charliecloud_image.sh does).
# The sources are third_party/enroot-*.tar.gz and third_party/pyxis-*.tar.gz (see third_party/README.md);
# the build needs Debian's makeself (2.4.5, the version Enroot pins), libbsd-dev and libslurm-dev (Pyxis
# must be built against the installed Slurm), all in `make system-deps`. Nothing is installed outside
# DEST: Pyxis runs the `enroot` it finds on slurmd's PATH, and the tests start their slurmd with
# DEST/bin first on it. DEST then holds:
#   bin/enroot, bin/enroot-*       Enroot 4.1.2, its configuration in etc/enroot
#   lib/slurm/spank_pyxis.so       Pyxis 0.24.0, built against this machine's libslurm-dev
# It is built in a temporary folder beside DEST and renamed into place; a lock keeps two sessions from
# building at once.
set -euo pipefail

die() { echo "pyxis_build: error: $*" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-${BERT_SQUAD_PYXIS:-${XDG_CACHE_HOME:-$HOME/.cache}/bert-squad/pyxis}}
ENROOT_SRC=$HERE/third_party/enroot-4.1.2.tar.gz
PYXIS_SRC=$HERE/third_party/pyxis-0.24.0.tar.gz
# VERSION: raise it when the recipe below changes, and a build by an older recipe is rebuilt. The Slurm
# version is part of the stamp: a Pyxis built against another libslurm is refused by slurmd.
VERSION=1
SLURM_VERSION=$(dpkg-query -W -f '${Version}' libslurm-dev 2>/dev/null || true)
STAMP="bert-squad enroot-pyxis build v$VERSION: enroot 4.1.2, pyxis 0.24.0, libslurm-dev $SLURM_VERSION"

current() { [ "$(cat "$DEST/.bert-squad-build" 2>/dev/null)" = "$STAMP" ]; }
if current; then
  echo "$DEST"
  exit 0
fi
[ -n "$SLURM_VERSION" ] || die "libslurm-dev is not installed (apt-get install libslurm-dev, or make system-deps)"
for tool in makeself cc make; do
  command -v "$tool" >/dev/null || die "$tool is not installed (make system-deps installs the build packages)"
done
[ -f /usr/include/bsd/string.h ] || die "libbsd-dev is not installed (apt-get install libbsd-dev)"
# shellcheck source=tests/build_once.sh
source "$HERE/tests/build_once.sh"
build_once_start
echo "pyxis_build: building Enroot and Pyxis into $DEST" >&2
tar -xzf "$ENROOT_SRC" -C "$tmp"
tar -xzf "$PYXIS_SRC" -C "$tmp"
(
  cd "$tmp"/enroot-*
  # The git submodules are not in the source archive: Debian's makeself is the pinned 2.4.5, Debian's
  # kernel headers replace linux-headers, and the utilities link glibc (FORCE_GLIBC) instead of musl.
  install -m 755 "$(command -v makeself)" deps/makeself/makeself.sh
  touch deps/linux-headers/.stamp
  # glibc 2.36 has no strlcpy/strlcat (2.38 has): libbsd's, linked statically.
  CPPFLAGS='-D_GNU_SOURCE= -include bsd/string.h' make FORCE_GLIBC=1 prefix="$DEST" DESTDIR="$tmp/stage" \
    LDLIBS="-l:libbsd.a $(find /usr/lib -name libbsd.a -print -quit)" install
) >"$tmp/enroot.log" 2>&1 || { tail -n 20 "$tmp/enroot.log" >&2; die "building Enroot failed (log above)"; }
# make install wrote the staging prefix into the paths it substitutes; the installed tree lives at DEST.
sed -i "s;$tmp/stage;;g" "$tmp/stage$DEST/bin/enroot" "$tmp/stage$DEST/etc/enroot/enroot.conf"
(cd "$tmp"/pyxis-* && make && install -D -m 644 spank_pyxis.so "$tmp/stage$DEST/lib/slurm/spank_pyxis.so") \
  >"$tmp/pyxis.log" 2>&1 || { tail -n 20 "$tmp/pyxis.log" >&2; die "building Pyxis failed (log above)"; }
echo "$STAMP" > "$tmp/stage$DEST/.bert-squad-build"
[ ! -e "$DEST" ] || mv -T "$DEST" "$tmp/old"
mv -T "$tmp/stage$DEST" "$DEST"
echo "$DEST"
