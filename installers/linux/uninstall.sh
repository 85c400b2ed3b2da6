#!/bin/sh
# Remove what install.sh put in place. Models, chats and settings are kept unless --purge.
#
#   ~/.local/lib/candlewick/uninstall.sh [--purge]
set -eu

DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
LIB=${CANDLEWICK_INSTALL_LIB:-$HOME/.local/lib/candlewick}
PURGE=no
for arg in "$@"; do
    case "$arg" in
        --purge) PURGE=yes ;;
        *) echo "uninstall.sh: error: unknown option $arg (only --purge)" >&2; exit 2 ;;
    esac
done

if [ ! -d "$LIB" ]; then
    echo "Candlewick is not installed in $LIB"
else
    if [ -f "$LIB/installed-files.txt" ]; then
        while IFS= read -r f; do
            # Only what install.sh wrote: the symlink, the desktop entry, the icons.
            case "$f" in
                */icons/*/io.candlewick.Candlewick.*)
                    rm -f "$f"
                    # The size folders it created (hicolor/NxN/apps), if nothing else is there.
                    rmdir "$(dirname "$f")" "$(dirname "$(dirname "$f")")" 2>/dev/null || true ;;
                */candlewick|*/io.candlewick.Candlewick.*) rm -f "$f" ;;
            esac
        done <"$LIB/installed-files.txt"
    fi
    rm -rf "$LIB"
    if command -v update-desktop-database >/dev/null 2>&1; then
        update-desktop-database -q "$DATA_HOME/applications" 2>/dev/null || true
    fi
    if command -v gtk-update-icon-cache >/dev/null 2>&1 && [ -d "$DATA_HOME/icons/hicolor" ]; then
        gtk-update-icon-cache -q -f -t "$DATA_HOME/icons/hicolor" || true
    fi
    echo "Candlewick removed from $LIB"
fi

# The app's own folders (platformdirs on Linux).
DATA=$DATA_HOME/candlewick
CONFIG=${XDG_CONFIG_HOME:-$HOME/.config}/candlewick
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/candlewick
STATE=${XDG_STATE_HOME:-$HOME/.local/state}/candlewick
if [ "$PURGE" = yes ]; then
    rm -rf "$DATA" "$CONFIG" "$CACHE" "$STATE"
    echo "Removed models, chats, settings and logs."
else
    for d in "$DATA" "$CONFIG" "$CACHE" "$STATE"; do
        [ -e "$d" ] && echo "kept: $d"
    done
    echo "Your models and chats were kept; run with --purge to remove them too."
fi
