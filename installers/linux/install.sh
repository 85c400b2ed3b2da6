#!/bin/sh
# Install the Candlewick bundle for the current user (no root): the app in ~/.local/lib,
# a `candlewick` command in ~/.local/bin, a menu entry and icons in the XDG data dir.
#
#   ./install.sh [BUNDLE_DIR]      BUNDLE_DIR: the PyInstaller folder (holds `candlewick`);
#                                  default: ./candlewick next to this script (the tarball),
#                                  else dist/candlewick of the source tree.
# Uninstall: ~/.local/lib/candlewick/uninstall.sh (your models and chats are kept).
set -eu

APP_ID=io.candlewick.Candlewick
HERE=$(cd "$(dirname "$0")" && pwd)
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
LIB=${CANDLEWICK_INSTALL_LIB:-$HOME/.local/lib/candlewick}
BIN=${CANDLEWICK_INSTALL_BIN:-$HOME/.local/bin}

if [ -d "$HERE/resources" ]; then RES=$HERE/resources; else RES=$HERE/../../resources; fi
if [ $# -ge 1 ]; then BUNDLE=$1
elif [ -x "$HERE/candlewick/candlewick" ]; then BUNDLE=$HERE/candlewick
else BUNDLE=$HERE/../../dist/candlewick; fi

die() { echo "install.sh: error: $*" >&2; exit 2; }
[ -x "$BUNDLE/candlewick" ] || die "no Candlewick bundle at $BUNDLE (build one with 'make dist')"
[ -f "$RES/$APP_ID.desktop" ] || die "desktop entry not found in $RES"
BUNDLE=$(cd "$BUNDLE" && pwd)

# Qt's xcb plugin (X11 desktops) cannot start without libxcb-cursor; many minimal installs
# lack it. Wayland sessions do not need it, so this is a warning, not a failure.
has_lib() {
    if command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q "$1"; then
        return 0
    fi
    for d in /usr/lib /usr/lib64 /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /lib /lib64; do
        [ -e "$d/$1" ] && return 0
    done
    return 1
}
if [ -z "${CANDLEWICK_SKIP_XCB_CHECK:-}" ] && ! has_lib libxcb-cursor.so.0; then
    . /etc/os-release 2>/dev/null || true
    case "${ID:-} ${ID_LIKE:-}" in
        *fedora*|*rhel*|*centos*) pkg="sudo dnf install xcb-util-cursor" ;;
        *suse*) pkg="sudo zypper install libxcb-cursor0" ;;
        *arch*) pkg="sudo pacman -S xcb-util-cursor" ;;
        *) pkg="sudo apt install libxcb-cursor0" ;;
    esac
    echo "warning: libxcb-cursor is missing; on an X11 desktop the window will not open." >&2
    echo "         install it with: $pkg" >&2
fi

MANIFEST_NEW=$(mktemp)
trap 'rm -f "$MANIFEST_NEW"' EXIT

# The bundle: copied next to the old one, then swapped in, so a failed copy leaves the old
# install working.
mkdir -p "$LIB" "$BIN" "$DATA_HOME/applications"
rm -rf "$LIB/app.new"
cp -R "$BUNDLE" "$LIB/app.new"
rm -rf "$LIB/app"
mv "$LIB/app.new" "$LIB/app"
cp "$HERE/uninstall.sh" "$LIB/uninstall.sh"
chmod +x "$LIB/uninstall.sh"

ln -sf "$LIB/app/candlewick" "$BIN/candlewick"
echo "$BIN/candlewick" >>"$MANIFEST_NEW"

DESKTOP=$DATA_HOME/applications/$APP_ID.desktop
sed -e "s|^Exec=.*|Exec=\"$LIB/app/candlewick\"|" \
    -e "/^Exec=/a TryExec=$LIB/app/candlewick" "$RES/$APP_ID.desktop" >"$DESKTOP"
echo "$DESKTOP" >>"$MANIFEST_NEW"

ICONS=$DATA_HOME/icons/hicolor
for png in "$RES"/icons/candlewick-*.png; do
    size=$(basename "$png" .png | sed 's/candlewick-//')
    mkdir -p "$ICONS/${size}x${size}/apps"
    cp "$png" "$ICONS/${size}x${size}/apps/$APP_ID.png"
    echo "$ICONS/${size}x${size}/apps/$APP_ID.png" >>"$MANIFEST_NEW"
done
mkdir -p "$ICONS/scalable/apps"
cp "$RES/icons/candlewick.svg" "$ICONS/scalable/apps/$APP_ID.svg"
echo "$ICONS/scalable/apps/$APP_ID.svg" >>"$MANIFEST_NEW"
cp "$MANIFEST_NEW" "$LIB/installed-files.txt"

# Tell the desktop about the new entry and icons (each tool is optional).
if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database -q "$DATA_HOME/applications" || true
fi
if command -v gtk-update-icon-cache >/dev/null 2>&1; then
    gtk-update-icon-cache -q -f -t "$ICONS" || true
fi

echo "Candlewick installed: $LIB/app"
echo "  menu entry: $DESKTOP"
echo "  command:    $BIN/candlewick"
case ":$PATH:" in *":$BIN:"*) ;; *) echo "  note: $BIN is not on your PATH; add it to run 'candlewick' from a terminal" ;; esac
echo "  check it:   $BIN/candlewick --self-test"
echo "  uninstall:  $LIB/uninstall.sh"
