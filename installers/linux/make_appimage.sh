#!/bin/sh
# Wrap the one-folder bundle as an AppImage: builds the AppDir, then runs appimagetool
# (https://github.com/AppImage/appimagetool) when it is on PATH. Without it, the AppDir is
# left in OUT_DIR and the tarball (make_tarball.sh) is the Linux download.
#
#   installers/linux/make_appimage.sh dist/candlewick dist
set -eu

BUNDLE=${1:?usage: make_appimage.sh BUNDLE_DIR OUT_DIR}
OUT=${2:?usage: make_appimage.sh BUNDLE_DIR OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
APP_ID=io.candlewick.Candlewick
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)
ARCH=$(uname -m)

[ -x "$BUNDLE/candlewick" ] || { echo "make_appimage.sh: no bundle at $BUNDLE" >&2; exit 2; }
APPDIR=$OUT/Candlewick.AppDir
rm -rf "$APPDIR"
mkdir -p "$APPDIR/usr/lib" "$APPDIR/usr/share/applications"
cp -R "$BUNDLE" "$APPDIR/usr/lib/candlewick"
cat >"$APPDIR/AppRun" <<'RUN'
#!/bin/sh
HERE=$(dirname "$(readlink -f "$0")")
exec "$HERE/usr/lib/candlewick/candlewick" "$@"
RUN
chmod +x "$APPDIR/AppRun"
cp "$ROOT/resources/$APP_ID.desktop" "$APPDIR/$APP_ID.desktop"
cp "$ROOT/resources/$APP_ID.desktop" "$APPDIR/usr/share/applications/"
cp "$ROOT/resources/icons/candlewick-256.png" "$APPDIR/$APP_ID.png"
ln -s "$APP_ID.png" "$APPDIR/.DirIcon"
for png in "$ROOT"/resources/icons/candlewick-*.png; do
    size=$(basename "$png" .png | sed 's/candlewick-//')
    mkdir -p "$APPDIR/usr/share/icons/hicolor/${size}x${size}/apps"
    cp "$png" "$APPDIR/usr/share/icons/hicolor/${size}x${size}/apps/$APP_ID.png"
done

if command -v appimagetool >/dev/null 2>&1; then
    ARCH=$ARCH appimagetool "$APPDIR" "$OUT/Candlewick-$VERSION-$ARCH.AppImage"
    echo "$OUT/Candlewick-$VERSION-$ARCH.AppImage"
else
    echo "appimagetool not found: AppDir left at $APPDIR (run: appimagetool $APPDIR)" >&2
    echo "$APPDIR"
fi
