#!/bin/sh
# Build the fake NVML library that tests load through the real pynvml.
#
#   tests/fakenvml/build.sh [OUTDIR]
#
# OUTDIR defaults to build/fakenvml under the repository root; works from any
# cwd. Produces OUTDIR/libnvidia-ml.so.1 and the symlink OUTDIR/libnvidia-ml.so.
# Does nothing when the library is newer than fakenvml.c and this script.
# The library is linked under a temporary name and renamed into place, so a
# concurrent test run never loads a half-written file.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
outdir=${1:-"$root/build/fakenvml"}
src="$here/fakenvml.c"
lib="$outdir/libnvidia-ml.so.1"

mkdir -p "$outdir"

if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ] || [ "$here/build.sh" -nt "$lib" ]; then
    tmp="$outdir/.libnvidia-ml.so.1.$$"
    trap 'rm -f "$tmp"' EXIT
    ${CC:-gcc} -O2 -shared -fPIC -Wall -Werror -o "$tmp" "$src" -lpthread
    mv -f "$tmp" "$lib"
    trap - EXIT
fi

if [ "$(readlink "$outdir/libnvidia-ml.so" 2>/dev/null || true)" != "libnvidia-ml.so.1" ]; then
    ln -sfn libnvidia-ml.so.1 "$outdir/libnvidia-ml.so.tmp.$$"
    mv -f "$outdir/libnvidia-ml.so.tmp.$$" "$outdir/libnvidia-ml.so"
fi

echo "$outdir"
