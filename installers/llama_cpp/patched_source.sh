#!/usr/bin/env bash
# llama-cpp-python's source release with Candlewick's patches applied to the llama.cpp it vendors
# (installers/llama_cpp/*.patch), unpacked into DEST for `pip install DEST`.
#
#   installers/llama_cpp/patched_source.sh PYTHON REQUIREMENT DEST
#
# The tree is prepared beside DEST and moved into place only once every patch has applied, so a
# failed download or patch never leaves a half-patched source that a later build would take.
set -euo pipefail
py=$1 requirement=$2 dest=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$(dirname "$dest")"
work=$(mktemp -d "$dest.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$py" -m pip download --quiet --no-binary :all: --no-deps --no-cache-dir -d "$work" "$requirement"
tar -xzf "$work"/*.tar.gz -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)
for p in "$here"/*.patch; do
  patch --batch --forward --quiet -p1 -d "$src" < "$p"
done
rm -rf "$dest"
mv "$src" "$dest"
