#!/bin/sh
# Pack the one-folder bundle with its installer into a tarball a user unpacks and installs:
#   candlewick-VERSION-linux-ARCH/{candlewick/, install.sh, uninstall.sh, resources/, README.txt}
#
#   installers/linux/make_tarball.sh dist/candlewick dist
set -eu

BUNDLE=${1:?usage: make_tarball.sh BUNDLE_DIR OUT_DIR}
OUT=${2:?usage: make_tarball.sh BUNDLE_DIR OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)
NAME=candlewick-$VERSION-linux-$(uname -m)

[ -x "$BUNDLE/candlewick" ] || { echo "make_tarball.sh: no bundle at $BUNDLE" >&2; exit 2; }
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/$NAME/resources/icons"
cp -R "$BUNDLE" "$STAGE/$NAME/candlewick"
cp "$HERE/install.sh" "$HERE/uninstall.sh" "$STAGE/$NAME/"
cp "$ROOT/resources/io.candlewick.Candlewick.desktop" "$STAGE/$NAME/resources/"
cp "$ROOT"/resources/icons/candlewick.svg "$ROOT"/resources/icons/candlewick-*.png \
    "$STAGE/$NAME/resources/icons/"
cat >"$STAGE/$NAME/README.txt" <<TXT
Candlewick $VERSION for Linux ($(uname -m))

Install for your user (no root needed):   ./install.sh
Check the install without a display:      ~/.local/bin/candlewick --self-test
Uninstall (keeps models and chats):       ~/.local/lib/candlewick/uninstall.sh
Run without installing:                   ./candlewick/candlewick

On X11 desktops Qt needs libxcb-cursor (Debian/Ubuntu: sudo apt install libxcb-cursor0;
Fedora: sudo dnf install xcb-util-cursor). install.sh warns when it is missing.
TXT
mkdir -p "$OUT"
tar -C "$STAGE" -czf "$OUT/$NAME.tar.gz" "$NAME"
echo "$OUT/$NAME.tar.gz"
