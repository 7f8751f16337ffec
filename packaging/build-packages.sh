#!/bin/sh
# Builds dsd's Debian packages (dpkg-buildpackage -b -us -uc) and RPM packages (rpmbuild)
# from this working tree and checks what they contain.
#
#   packaging/build-packages.sh [--cuda=auto|disabled] [OUTDIR]
#
# --cuda=disabled builds the CPU backend only (DEB_BUILD_PROFILES=nocuda, rpmbuild
# --without cuda); auto (the default) builds the CUDA backend where nvcc is found. OUTDIR
# (default build-packages/) receives the .deb and .rpm files and a copy of the tree each
# build runs in. The tools come from tools/install-deps.sh (debhelper, dpkg-dev, rpm,
# fakeroot). Exit status 0 only when both packages built and list the expected files.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
cuda=auto
out=
for a in "$@"; do
        case "$a" in
        --cuda=auto | --cuda=disabled) cuda=${a#--cuda=} ;;
        -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "build-packages: unknown option $a" >&2; exit 2 ;;
        *) out=$a ;;
        esac
done
out=$(mkdir -p "${out:-$src/build-packages}" && cd "${out:-$src/build-packages}" && pwd)
version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$src/meson.build" | head -n 1)
for tool in dpkg-buildpackage dh rpmbuild fakeroot; do
        command -v "$tool" >/dev/null || {
                echo "build-packages: $tool is missing (tools/install-deps.sh installs it)" >&2
                exit 1
        }
done

# The tracked files plus untracked ones git does not ignore, as they are in the working
# tree: build directories and other local output stay out.
stage=$out/dsd-$version
rm -rf "$stage" "$out"/*.deb "$out"/*.rpm "$out"/*.buildinfo "$out"/*.changes "$out/rpm"
mkdir -p "$stage"
# Files deleted but not yet committed are skipped.
(cd "$src" && git ls-files -z --cached --others --exclude-standard |
        tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$stage" -xf -
# dpkg-buildpackage wants debian/ at the top of the source; it lives in packaging/.
cp -a "$src/packaging/debian" "$stage/debian"

echo "=== .deb (cuda $cuda)"
profiles=
[ "$cuda" = disabled ] && profiles=nocuda
(cd "$stage" && DEB_BUILD_PROFILES=$profiles dpkg-buildpackage -b -us -uc >"$out/deb.log" 2>&1) || {
        tail -n 40 "$out/deb.log" >&2
        exit 1
}
rm -rf "$stage/debian" "$stage/obj-"*

echo "=== .rpm (cuda $cuda)"
# Debian's rpm has no database of the build dependencies the spec names, so rpmbuild
# checks none of them (--nodeps); dpkg already checked the same set above.
mkdir -p "$out/rpm/SOURCES"
tar -C "$out" -czf "$out/rpm/SOURCES/dsd-$version.tar.gz" "dsd-$version"
cp "$src/packaging/dsd.sysusers" "$out/rpm/SOURCES/dsd.sysusers"
without=
[ "$cuda" = disabled ] && without="--without cuda"
# shellcheck disable=SC2086 # $without is empty or two words
rpmbuild -bb --nodeps $without --define "_topdir $out/rpm" \
        "$src/packaging/rpm/dsd.spec" >"$out/rpm.log" 2>&1 || {
        tail -n 40 "$out/rpm.log" >&2
        exit 1
}
find "$out/rpm/RPMS" -name '*.rpm' -exec mv {} "$out" \;

# What an installed system needs from each package.
fail=0
expect() { # LISTING PATH...
        listing=$1
        shift
        for f in "$@"; do
                grep -q -- "$f\$" "$listing" || {
                        echo "build-packages: $f missing from $(basename "$listing" .list)" >&2
                        fail=1
                }
        done
}
for deb in "$out"/*.deb; do
        dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's,^\.,,' >"$deb.list"
done
# Manual pages: compressed by dh_compress and rpm's brp-compress where it runs.
man="/usr/share/man/man8/dsd.8 /usr/share/man/man1/dsctl.1 /usr/share/man/man1/dsquant.1
/usr/share/man/man1/dsbench.1 /usr/share/man/man5/dsd.json.5"
# shellcheck disable=SC2086 # $man is a list of paths
expect "$(ls "$out"/dsd_*.deb).list" $(for m in $man; do echo "$m.gz"; done)
expect "$(ls "$out"/dsd_*.deb).list" /usr/bin/dsd /usr/bin/dsctl /etc/dsd/dsd.json \
        /lib/systemd/system/dsd.service /lib/systemd/system/dsd.socket \
        /usr/lib/sysusers.d/dsd.conf /usr/lib/tmpfiles.d/dsd.conf \
        /usr/share/dbus-1/system.d/io.dsd.Daemon1.conf \
        /usr/share/dbus-1/system-services/io.dsd.Daemon1.service
expect "$(ls "$out"/libdsclient0_*.deb).list" "/libdsclient.so.0"
expect "$(ls "$out"/libdsclient-dev_*.deb).list" /usr/include/dsclient.h "/pkgconfig/dsclient.pc"
for s in postinst prerm postrm; do
        dpkg-deb --ctrl-tarfile "$(ls "$out"/dsd_*.deb)" | tar -xO "./$s" 2>/dev/null |
                grep -q dh_installsystemd || {
                echo "build-packages: the dsd .deb has no $s from dh_installsystemd" >&2
                fail=1
        }
done
for rpm in "$out"/*.rpm; do
        rpm -qlp "$rpm" 2>/dev/null >"$rpm.list"
done
for m in $man; do
        grep -q -- "$m\(\.gz\)\?\$" "$(ls "$out"/dsd-"$version"-*.rpm).list" || {
                echo "build-packages: $m missing from the dsd .rpm" >&2
                fail=1
        }
done
expect "$(ls "$out"/dsd-"$version"-*.rpm).list" /usr/bin/dsd /usr/bin/dsctl /etc/dsd/dsd.json \
        /usr/lib/systemd/system/dsd.service /usr/lib/systemd/system/dsd.socket \
        /usr/lib/sysusers.d/dsd.conf /usr/lib/tmpfiles.d/dsd.conf \
        /usr/share/dbus-1/system.d/io.dsd.Daemon1.conf \
        /usr/share/dbus-1/system-services/io.dsd.Daemon1.service
expect "$(ls "$out"/libdsclient-"$version"-*.rpm).list" "/libdsclient.so.0"
expect "$(ls "$out"/libdsclient-devel-*.rpm).list" /usr/include/dsclient.h "/pkgconfig/dsclient.pc"
rpm -qp --scripts "$(ls "$out"/dsd-"$version"-*.rpm)" 2>/dev/null | grep -q systemctl || {
        echo "build-packages: the dsd .rpm has no systemd scriptlets" >&2
        fail=1
}
[ "$fail" -eq 0 ] || exit 1
ls -1 "$out"/*.deb "$out"/*.rpm
echo "build-packages: .deb and .rpm built and their listings match (cuda $cuda)"
