#!/bin/sh
# Lints packaging/: the units pass systemd-analyze verify (and a broken copy does not, so
# the check is known to bite here), sysusers.d and tmpfiles.d entries are accepted by
# systemd's own tools, the D-Bus policy and activation files load into a real dbus-daemon,
# and the configured dsd.service names the installed paths.
#   test-packaging.sh BUILT_DSD_SERVICE
set -eu
src=${DSD_SOURCE:?run through meson test}/packaging
service=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
skipped=0

note_skip() {
        echo "SKIP (part): $*"
        skipped=$((skipped + 1))
}

# The units, with ExecStart pointing at a binary that exists on this machine.
if command -v systemd-analyze >/dev/null; then
        sed 's#^ExecStart=[^ ]*#ExecStart=/bin/true#' "$service" >"$tmp/dsd.service"
        cp "$src/dsd.socket" "$tmp/"
        # verify exits 0 on values it ignores ("Failed to parse ..., ignoring"), so any
        # output counts as a failure too.
        verify() {
                systemd-analyze verify "$@" >"$tmp/verify.log" 2>&1 && ! [ -s "$tmp/verify.log" ]
        }
        if ! verify "$tmp/dsd.service" "$tmp/dsd.socket"; then
                cat "$tmp/verify.log"
                echo "FAIL: systemd-analyze verify refused the units"
                fail=1
        fi
        mkdir "$tmp/broken"
        sed 's/^Type=notify/Type=notifyy/' "$tmp/dsd.service" >"$tmp/broken/dsd.service"
        cp "$src/dsd.socket" "$tmp/broken/"
        if verify "$tmp/broken/dsd.service" "$tmp/broken/dsd.socket"; then
                echo "FAIL: systemd-analyze verify accepted Type=notifyy; the check is toothless"
                fail=1
        fi
else
        note_skip "systemd-analyze is not installed; units not verified"
fi
grep -q '^Type=notify$' "$service" || { echo "FAIL: dsd.service is not Type=notify"; fail=1; }
grep -q "^ExecStart=/.*/dsd --config /.*/dsd/dsd.json$" "$service" ||
        { echo "FAIL: ExecStart of the configured unit: $(grep ^ExecStart "$service")"; fail=1; }
grep -q '@[a-z]*@' "$service" && { echo "FAIL: unsubstituted @var@ in $service"; fail=1; }
grep -q '^ListenStream=/run/dsd/dsd.sock$' "$src/dsd.socket" ||
        { echo "FAIL: dsd.socket does not listen on the default socket.path"; fail=1; }

if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers --dry-run "$src/dsd.sysusers" >"$tmp/sysusers.log" 2>&1 ||
                { cat "$tmp/sysusers.log"; echo "FAIL: systemd-sysusers refused dsd.sysusers"; fail=1; }
        grep -q "Creating user 'dsd'" "$tmp/sysusers.log" ||
                { cat "$tmp/sysusers.log"; echo "FAIL: dsd.sysusers does not create dsd"; fail=1; }
else
        note_skip "systemd-sysusers is not installed"
fi
if command -v systemd-tmpfiles >/dev/null; then
        mkdir "$tmp/root"
        systemd-tmpfiles --root="$tmp/root" --create "$src/dsd.tmpfiles" &&
                test -d "$tmp/root/var/lib/dsd/models" ||
                { echo "FAIL: systemd-tmpfiles did not create /var/lib/dsd/models"; fail=1; }
else
        note_skip "systemd-tmpfiles is not installed"
fi

# The policy file loads into a dbus-daemon configuration (a syntax error makes it exit).
if command -v dbus-daemon >/dev/null; then
        cat >"$tmp/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$tmp/bus</listen>
  <auth>EXTERNAL</auth>
  <servicedir>$src</servicedir>
  <include>$src/io.dsd.Daemon1.conf</include>
</busconfig>
CONF
        if ! dbus-daemon --config-file="$tmp/bus.conf" --fork --print-pid=1 >"$tmp/pid" \
                2>"$tmp/bus.log"; then
                cat "$tmp/bus.log"
                echo "FAIL: dbus-daemon refused io.dsd.Daemon1.conf or io.dsd.Daemon1.service"
                fail=1
        else
                kill "$(cat "$tmp/pid")"
        fi
else
        note_skip "dbus-daemon is not installed; the policy was not loaded"
fi
grep -q '^SystemdService=dsd.service$' "$src/io.dsd.Daemon1.service" ||
        { echo "FAIL: io.dsd.Daemon1.service does not activate dsd.service"; fail=1; }

[ $fail -eq 0 ] || exit 1
echo "test-packaging: ok ($skipped part(s) skipped)"
