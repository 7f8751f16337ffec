# SPDX-License-Identifier: MIT
"""What the tests that drive a real dsd over a private dbus-daemon share: the bus
configuration, soft checks that collect failures, the processes to kill at the end, and
the reference text of `dsd --generate`."""
import os
import select
import subprocess
import sys

import serve_common as sc

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={sock}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""

failures = []
procs = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def start(args, **kw):
    p = subprocess.Popen(args, **kw)
    procs.append(p)
    return p


def kill_all():
    for p in reversed(procs):
        if p.poll() is None:
            p.kill()
            p.wait()


def private_bus(tmp):
    """A dbus-daemon of BUS_CONFIG listening in tmp: (its socket path, the environment that
    points dsd, dsctl and busctl at it, without NOTIFY_SOCKET). Skips the test if it does
    not start."""
    bus_sock = os.path.join(tmp, "bus")
    conf = os.path.join(tmp, "bus.conf")
    with open(conf, "w") as f:
        f.write(BUS_CONFIG.format(sock=bus_sock))
    bus = start(["dbus-daemon", "--nofork", "--print-address=1", "--config-file=" + conf],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = bus.stdout.readline().strip()
    if not address:
        sc.skip("dbus-daemon did not start")
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=address)
    env.pop("NOTIFY_SOCKET", None)
    return bus_sock, env


def generate(model, prompt, n):
    """The text `dsd --generate` writes for prompt on the CPU backend, greedy."""
    p = subprocess.run([sc.DSD, "--model", model, "--backend", "cpu", "--generate", prompt,
                        "--max-tokens", str(n)], capture_output=True, timeout=300)
    if p.returncode != 0:
        sc.fail(f"dsd --generate on {model}: {p.stderr!r}")
    if not p.stdout:
        sc.fail(f"dsd --generate {prompt!r} on {model} wrote no text; pick another prompt")
    return p.stdout


def started(p, timeout=120):
    """The stream's first stderr line is "started", within timeout."""
    if not select.select([p.stderr], [], [], timeout)[0]:
        return False
    return p.stderr.readline().strip() == b"started"
