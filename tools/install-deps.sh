#!/bin/sh
# Installs what building, testing and packaging dsd needs (packaging/build-packages.sh:
# debhelper, dpkg-dev, fakeroot, rpm; groff-base, which checks the manual pages), from
# Debian's packages, plus one test-only tool from PyPI (prometheus_client, whose parser
# checks GET /metrics). One list, used by the README's quick start and by CI. Runs
# apt-get through sudo when not root.
set -eu
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
        gcc libc6-dev meson ninja-build pkg-config xz-utils python3 python3-pip \
        libcjson-dev libpcre2-dev libutf8proc-dev \
        libsystemd-dev liburing-dev libnuma-dev dbus dbus-daemon dbus-bin systemd \
        clang libclang-rt-14-dev \
        debhelper dpkg-dev fakeroot rpm groff-base >/dev/null
# Into the python3 the tests run with; Debian's own python3 refuses a plain install
# (PEP 668), hence the second try.
python3 -m pip install --quiet prometheus_client 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages prometheus_client
echo "install-deps: build and test dependencies are installed"
