#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what tests/gpu/run-on-device.sh installs on the device machine,
# which has no network: the wheels its python3 (CPython 3.12, x86-64) lacks, and promtool
# (xz-compressed: 9 MB instead of 48). Run it HERE, in the checkout that the device call will
# send (the device tool sends the session's own checkout, not a helper's worktree), then name
# .whl in the call's carry list. Safe to run again.
#
#   tests/gpu/fetch-wheels.sh
#
# The device image has torch, nvidia-ml-py, prometheus-client, psutil, PyYAML, pytest,
# pytest-timeout and hypothesis (.library/device/KINDS.md); the exporter also needs bcrypt, the
# benchmark nvitop-exporter and nvitop. pytest-timeout is carried too, in case the image lost it
# (run-on-device.sh installs only what is missing there).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest"
git check-ignore -q "$dest/x.whl" || {
    echo "fetch-wheels: $dest/ is not git-ignored; add /$dest/ to .gitignore first" >&2
    exit 1
}

# one version of each (two of one package stop pip --target); nvitop 1.7.2 accepts
# nvidia-ml-py < 13.616
wheels=(bcrypt==5.0.0 nvitop==1.7.2 nvitop-exporter==1.7.2 pytest-timeout==2.4.0)
rm -f "$dest"/*.whl
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" "${wheels[@]}"

promtool=$(command -v promtool || true)
if [[ -z $promtool ]]; then
    echo "fetch-wheels: no promtool here (Debian/Ubuntu: apt-get install prometheus)" >&2
    exit 1
fi
if [[ ! -f $dest/promtool.xz || $promtool -nt $dest/promtool.xz ]]; then
    # Debian's promtool links only glibc (symbols up to GLIBC_2.34); the device's Python 3.12.3
    # suggests Ubuntu 24.04 (glibc 2.39), not checked: run-on-device.sh logs whether it runs
    xz -6 -T0 -c "$promtool" >"$dest/promtool.xz.tmp"
    mv "$dest/promtool.xz.tmp" "$dest/promtool.xz"
fi

ls -l "$dest"
total=$(du -cb "$dest" | tail -n1 | cut -f1)
echo "fetch-wheels: $((total >> 20)) MiB in $dest (the device call carries at most 64 MiB with the tree)"
if ((total > 40 << 20)); then
    echo "fetch-wheels: too large" >&2
    exit 1
fi
