#!/bin/sh
# Copy a built bundle to a temporary folder outside the source tree, with an empty HOME and
# no display, and run its --self-test there: proves the bundle carries everything it needs.
#
#   installers/check_bundle.sh dist/candlewick        (or: make dist-check)
set -eu

BUNDLE=${1:-dist/candlewick}
[ -x "$BUNDLE/candlewick" ] || { echo "check_bundle.sh: no bundle at $BUNDLE (run make dist)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/candlewick-bundle.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cp -R "$BUNDLE" "$TMP/candlewick"
mkdir "$TMP/home"
cd "$TMP"
echo "+ $TMP/candlewick/candlewick --self-test"
# A clean environment: no virtualenv, no PYTHONPATH, no CANDLEWICK_HOME, no display.
env -i HOME="$TMP/home" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
    "$TMP/candlewick/candlewick" --self-test
