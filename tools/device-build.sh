#!/bin/sh
# Builds dsd with the CUDA backend on the GPU device machine (docs/device.md of shared/):
# unpacks the carried .deps/*.deb into a sysroot for the -dev libraries the machine lacks,
# points pkg-config and the loader at it, configures BUILD_DIR (default build-dev) with
# -Dcuda=enabled and shared_dir .device/shared (carry it), builds, then runs the remaining
# arguments, if any, with the same environment (-n: the environment only, no build):
#   tools/device-build.sh [-n | -C BUILD_DIR] [COMMAND ARGS...]
set -eu

build=build-dev
env_only=0
if [ "${1:-}" = "-n" ]; then
        env_only=1
        shift
elif [ "${1:-}" = "-C" ]; then
        build=$2
        shift 2
fi

sysroot=/tmp/sysroot
if [ ! -d "$sysroot/usr/lib/x86_64-linux-gnu/pkgconfig" ]; then
        mkdir -p "$sysroot"
        for f in .deps/*.deb; do dpkg -x "$f" "$sysroot"; done
        # libsystemd-dev's libsystemd.so points at the system's own runtime library.
        ln -sf /lib/x86_64-linux-gnu/libsystemd.so.0 "$sysroot/usr/lib/x86_64-linux-gnu/libsystemd.so.0"
fi
export PKG_CONFIG_PATH="$sysroot/usr/lib/x86_64-linux-gnu/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$sysroot"
export LD_LIBRARY_PATH="$sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ $env_only = 1 ]; then
        exec "$@"
fi

if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" -Dcuda=enabled -Dshared_dir=.device/shared >"${OUT:-/tmp}/meson-setup.log" 2>&1 ||
                { tail -30 "${OUT:-/tmp}/meson-setup.log"; exit 1; }
fi
# Targets another change breaks must not stop the CUDA ones: build what builds, name the rest.
ninja -C "$build" -k 0 >"${OUT:-/tmp}/ninja.log" 2>&1 || grep "^FAILED" "${OUT:-/tmp}/ninja.log" || true

if [ $# -gt 0 ]; then
        exec "$@"
fi
