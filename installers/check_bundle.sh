#!/bin/sh
# Copy a built bundle to a temporary folder outside the source tree, with an empty HOME and
# no display, and run its --self-test there: proves the bundle carries everything it needs.
# The self-test must find Qt Multimedia (voice input) in the bundle.
# Then the command line as a user starts it: a short answer from the bundled model (its first
# load tried in the bundle's own child process), and a damaged GGUF refused in one line.
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
APP=$TMP/candlewick/candlewick
# A clean environment: no virtualenv, no PYTHONPATH, no CANDLEWICK_HOME, no display.
clean() { env -i HOME="$TMP/home" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen "$@"; }

echo "+ $APP --self-test"
if ! clean "$APP" --self-test >"$TMP/selftest.txt"; then cat "$TMP/selftest.txt"; exit 1; fi
cat "$TMP/selftest.txt"
grep -q "voice input ready" "$TMP/selftest.txt" \
    || { echo "check_bundle.sh: the bundle lacks Qt Multimedia (voice input)" >&2; exit 1; }

echo "+ $APP run default 'Say hi.' --max-tokens 16"
clean "$APP" run default "Say hi." --max-tokens 16 --seed 1 >"$TMP/answer.txt"
[ -s "$TMP/answer.txt" ] || { echo "check_bundle.sh: no answer from the bundled model" >&2; exit 1; }
cat "$TMP/answer.txt"
[ -f "$TMP/home/.cache/candlewick/loaded-models.json" ] \
    || { echo "check_bundle.sh: the first load was not tried in a child process" >&2; exit 1; }

echo "+ $APP run broken.gguf 'Say hi.'"
head -c 1000000 "$(find "$TMP/candlewick" -name '*.gguf' | head -n1)" >"$TMP/broken.gguf"
if clean "$APP" run "$TMP/broken.gguf" "Say hi." >/dev/null 2>"$TMP/err.txt"; then
    echo "check_bundle.sh: a truncated GGUF was loaded" >&2; exit 1
fi
cat "$TMP/err.txt"
[ "$(wc -l <"$TMP/err.txt")" -eq 1 ] || { echo "check_bundle.sh: not one line" >&2; exit 1; }
echo "check_bundle.sh: ok"
