#!/bin/sh
# macOS: Candlewick.app and a drag-to-Applications .dmg from the PyInstaller spec.
# Run on a Mac (Apple Silicon: Metal is on by default in llama-cpp-python's build), from the
# repository root, after `make setup` (or `make setup GPU=metal`):
#
#   installers/macos/build_app.sh
#
# Output: dist/Candlewick.app and dist/Candlewick-<version>.dmg. The spec's BUNDLE step makes
# the .app (bundle id io.candlewick.Candlewick, icon resources/icons/candlewick.icns); this
# script checks it and packs the disk image with hdiutil (part of macOS).
# Signing and notarisation need an Apple Developer ID: set CODESIGN_ID to sign (ad-hoc
# signing "-" is used otherwise, which runs locally but Gatekeeper warns on other Macs).
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ "$(uname -s)" = Darwin ] || { echo "build_app.sh: run this on macOS" >&2; exit 2; }
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)

.venv/bin/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller \
    installers/candlewick.spec
APP=dist/Candlewick.app
[ -x "$APP/Contents/MacOS/candlewick" ] || { echo "build_app.sh: $APP was not built" >&2; exit 1; }

codesign --force --deep --sign "${CODESIGN_ID:--}" "$APP"

# The bundle must work on its own: copy it out of the tree and run the self-test there.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp -R "$APP" "$TMP/"
QT_QPA_PLATFORM=offscreen "$TMP/Candlewick.app/Contents/MacOS/candlewick" --self-test

STAGE=$TMP/dmg
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
rm -f "dist/Candlewick-$VERSION.dmg"
hdiutil create -volname "Candlewick $VERSION" -srcfolder "$STAGE" -ov -format UDZO \
    "dist/Candlewick-$VERSION.dmg"
echo "dist/Candlewick-$VERSION.dmg"
