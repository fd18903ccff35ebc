# shellcheck shell=bash
# Sourced by tests/charliecloud_image.sh, which builds something once per machine into $DEST and defines
# `current` (is $DEST built by this recipe?). `build_once_start` takes the lock
# beside $DEST, so two test sessions never build at once; if the other one built it meanwhile it prints
# $DEST and exits, else it leaves a temporary folder $tmp beside $DEST (removed on exit) to build in.
build_once_start() {
  mkdir -p "$(dirname "$DEST")"
  exec 9>"$DEST.lock"
  flock 9
  if current; then
    echo "$DEST"
    exit 0
  fi
  tmp=$(mktemp -d "$DEST.tmp.XXXXXX")
  # shellcheck disable=SC2064  # $tmp is fixed now
  trap "rm -rf --one-file-system '$tmp'" EXIT
}
