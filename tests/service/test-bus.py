#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""io.dsd.Daemon1 (daemon/bus.c) against a real, private dbus-daemon.

Starts dbus-daemon with a session-type configuration in a temporary directory, hosts the
object in bus-fake-daemon, and checks with busctl, dbus-monitor and dsctl's bus verbs:
properties and their change-signal annotations, PropertiesChanged on State, every method,
the asynchronous Reload reply (success, failure, refusal), and the credential check: a
caller outside root/the daemon's uid/the admin group gets AccessDenied, one in the admin
group gets through (needs root to run callers under another uid; skipped with a reason
otherwise).

Usage: test-bus.py FAKE_DAEMON DSCTL
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

FAKE, DSCTL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
NAME, PATH, IFACE = "io.dsd.Daemon1", "/io/dsd/Daemon1", "io.dsd.Daemon1"
ADMIN_GID = 4242  # a group no account has, so only the test's callers are in it
NOBODY = 65534

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={sock}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
"""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def skip(reason):
    print("SKIP:", reason)
    sys.exit(77)


for tool in ("dbus-daemon", "busctl", "dbus-monitor"):
    if not shutil.which(tool):
        skip(f"{tool} is not installed (tools/install-deps.sh installs it)")

tmp = tempfile.mkdtemp(prefix="dsd-bus-")
os.chmod(tmp, 0o755)  # callers under another uid must reach the socket
sock = os.path.join(tmp, "bus")
with open(os.path.join(tmp, "bus.conf"), "w") as f:
    f.write(CONFIG.format(sock=sock))

procs = []


def start(args, **kw):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, **kw)
    procs.append(p)
    return p


def cleanup():
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
    shutil.rmtree(tmp, ignore_errors=True)


try:
    bus = start(["dbus-daemon", "--nofork", "--print-address=1",
                 "--config-file=" + os.path.join(tmp, "bus.conf")], stderr=subprocess.DEVNULL)
    address = bus.stdout.readline().strip()
    if not address:
        skip("dbus-daemon did not start")
    os.chmod(sock, 0o777)
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=address, DSD_BUS="session")

    fake = start([FAKE, str(ADMIN_GID)], env=env)
    check(fake.stdout.readline().strip() == "ready", "bus-fake-daemon did not get ready")

    def busctl(*args, user=None, groups=None):
        cmd = ["busctl", "--address=" + address] + list(args)
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}",
                   f"--groups={groups}" if groups else "--clear-groups", "--"] + cmd
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)

    def prop(name):
        r = busctl("--json=short", "get-property", NAME, PATH, IFACE, name)
        check(r.returncode == 0, f"get-property {name}: {r.stderr}")
        return json.loads(r.stdout)["data"] if r.returncode == 0 else None

    def call(method, sig="", *args, user=None, groups=None):
        return busctl("--json=short", "call", NAME, PATH, IFACE, method, sig, *args,
                      user=user, groups=groups)

    # Properties and their values.
    check(prop("State") == "ready", "State is not ready")
    check(prop("Model") == "/models/a", "Model")
    check(prop("Backend") == "cpu", "Backend")
    check(prop("Device") == "cpu (1 thread)", "Device")
    check(prop("Version") == "0.1.0-test", "Version")
    check(prop("StartedAt") == 1700000000000000, "StartedAt")
    check(prop("ContextLength") == 2048, "ContextLength")
    check(prop("Architecture") == "Qwen2ForCausalLM", "Architecture")
    check(prop("KVBytesPerToken") == 2048, "KVBytesPerToken")
    for name, want in [("ActiveRequests", 2), ("QueuedRequests", 1), ("Clients", 2),
                       ("KVBlocksTotal", 128), ("KVBlocksFree", 100),
                       ("GPUMemoryUsed", 3 << 30), ("GPUMemoryTotal", 80 << 30),
                       ("TokensPerSecond", 12.5)]:
        check(prop(name) == want, f"{name} != {want}")

    # The introspection data tells clients which properties are change-signalled.
    r = busctl("introspect", "--xml-interface", NAME, PATH)
    iface = [i for i in ET.fromstring(r.stdout).findall("interface") if i.get("name") == IFACE][0]
    emits = {}
    for p in iface.findall("property"):
        ann = [a.get("value") for a in p.findall("annotation")
               if a.get("name") == "org.freedesktop.DBus.Property.EmitsChangedSignal"]
        emits[p.get("name")] = ann[0] if ann else "true"
    for name in ("State", "Model", "Backend", "Device", "ContextLength", "Architecture",
                 "KVBytesPerToken"):
        check(emits.get(name) == "true", f"{name} should emit PropertiesChanged: {emits.get(name)}")
    for name in ("Version", "StartedAt"):
        check(emits.get(name) == "const", f"{name} should be const: {emits.get(name)}")
    for name in ("ActiveRequests", "QueuedRequests", "Clients", "KVBlocksTotal", "KVBlocksFree",
                 "GPUMemoryUsed", "GPUMemoryTotal", "TokensPerSecond"):
        check(emits.get(name) == "false", f"{name} should not be change-signalled: {emits.get(name)}")
    methods = {m.get("name"): [(a.get("direction", "in"), a.get("type")) for a in m.findall("arg")]
               for m in iface.findall("method")}
    check(methods.get("Reload") == [("in", "s")], f"Reload signature {methods.get('Reload')}")
    check(methods.get("ListClients") == [("out", "a(tuusutt)")], "ListClients signature")
    check(methods.get("GetStats") == [("out", "a{sv}")], "GetStats signature")
    check(methods.get("Cancel") == [("in", "t")], "Cancel signature")

    # PropertiesChanged: watch while draining, resuming and reloading.
    mon = start(["dbus-monitor", "--address", address,
                 f"type='signal',sender='{NAME}',path='{PATH}',"
                 "interface='org.freedesktop.DBus.Properties',member='PropertiesChanged'"],
                stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # the match is installed once dbus-monitor has connected

    r = call("Drain")
    check(r.returncode == 0, f"Drain: {r.stderr}")
    check(prop("State") == "draining", "State after Drain")
    r = call("Reload", "s", "/models/b")
    check(r.returncode != 0 and "Busy" not in r.stderr and "draining" in r.stderr,
          f"Reload while draining should be refused by the daemon: {r.stderr}")
    r = call("Resume")
    check(r.returncode == 0 and prop("State") == "ready", f"Resume: {r.stderr}")

    t0 = time.monotonic()
    r = call("Reload", "s", "/models/b")
    took = time.monotonic() - t0
    check(r.returncode == 0, f"Reload: {r.stderr}")
    check(took >= 0.15, f"Reload replied before the reload completed ({took:.3f}s)")
    check(prop("Model") == "/models/b" and prop("ContextLength") == 4096
          and prop("Architecture") == "DeepseekV2ForCausalLM" and prop("KVBytesPerToken") == 3456,
          "Model after Reload")

    r = call("Reload", "s", "/models/fail")
    check(r.returncode != 0 and "field 'hidden_size' is missing" in r.stderr,
          f"failed Reload should carry the daemon's message: {r.stderr}")
    check(prop("Model") == "/models/b" and prop("State") == "ready",
          "a failed reload must leave the old model serving")
    r = call("Reload", "s", "models/relative")
    check(r.returncode != 0 and "absolute" in r.stderr, f"relative Reload: {r.stderr}")

    time.sleep(0.3)
    mon.terminate()
    out = mon.communicate(timeout=5)[0]
    # Each signal lists the changed names and values; State goes draining, ready,
    # reloading, ready (Model and ContextLength change in the same signal), reloading, ready.
    states = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if 'string "State"' in line:
            for nxt in lines[i + 1:i + 3]:
                if "string " in nxt:
                    states.append(nxt.split('"')[1])
                    break
    check(states == ["draining", "ready", "reloading", "ready", "reloading", "ready"],
          f"PropertiesChanged State sequence {states}")
    check('string "/models/b"' in out and "uint32 4096" in out
          and 'string "DeepseekV2ForCausalLM"' in out and "uint64 3456" in out,
          "PropertiesChanged carries the new Model, ContextLength, Architecture and "
          "KVBytesPerToken")
    check('"ActiveRequests"' not in out, "a counter was change-signalled")

    # ListClients, GetStats, Cancel.
    r = call("ListClients")
    data = json.loads(r.stdout)["data"][0] if r.returncode == 0 else None
    check(data == [[7, 1234, 1000, "chat", 1, 3, 300], [9, 1240, 0, "batchjob", 1, 7, 1200]],
          f"ListClients {data}")
    r = call("GetStats")
    stats = {k: v["data"] for k, v in json.loads(r.stdout)["data"][0].items()} if r.returncode == 0 else {}
    check(stats.get("RequestsTotal") == 10 and stats.get("TimeToFirstTokenP99USec") == 9000
          and stats.get("ReloadsTotal") == 1, f"GetStats {stats}")
    r = call("Cancel", "t", "7")
    check(r.returncode == 0, f"Cancel 7: {r.stderr}")
    r = call("Cancel", "t", "8")
    check(r.returncode != 0 and "No request or client with id 8" in r.stderr,
          f"Cancel 8: {r.stderr}")

    # The credential check, with callers under another uid.
    if os.geteuid() != 0:
        print("SKIP (part): the access-denied checks run callers as uid 65534 and need root")
    elif not shutil.which("setpriv"):
        print("SKIP (part): setpriv is not installed; the access-denied checks need it")
    else:
        r = busctl("--json=short", "get-property", NAME, PATH, IFACE, "State", user=NOBODY)
        check(r.returncode == 0, f"anyone may read properties: {r.stderr}")
        for method, sig, args in [("Drain", "", []), ("Resume", "", []),
                                  ("Reload", "s", [""]), ("Cancel", "t", ["7"])]:
            r = call(method, sig, *args, user=NOBODY)
            check(r.returncode != 0 and "Access" in r.stderr and "denied" in r.stderr,
                  f"{method} as uid {NOBODY} should be AccessDenied: rc={r.returncode} {r.stderr}")
        check(prop("State") == "ready", "a refused Drain changed the state")
        r = call("ListClients", user=NOBODY)
        check(r.returncode == 0, f"ListClients is not mutating: {r.stderr}")
        r = call("Drain", user=NOBODY, groups=str(ADMIN_GID))
        check(r.returncode == 0, f"Drain from the admin group: {r.stderr}")
        r = call("Resume", user=NOBODY, groups=str(ADMIN_GID))
        check(r.returncode == 0, f"Resume from the admin group: {r.stderr}")
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                            "--clear-groups", DSCTL, "drain"], capture_output=True, text=True,
                           env=env, timeout=30)
        check(r.returncode == 1 and "denied" in r.stderr,
              f"dsctl drain as nobody: rc={r.returncode} {r.stderr}")

    # dsctl's bus verbs against the same object.
    def dsctl(*args, **extra_env):
        return subprocess.run([DSCTL] + list(args), capture_output=True, text=True,
                              env=dict(env, **extra_env), timeout=30)

    # DSD_BUS: an unknown value is a usage error naming the variable and the values it
    # takes, not the system bus; an option overrides the variable.
    r = dsctl("status", DSD_BUS="bogus")
    check(r.returncode == 2 and "DSD_BUS='bogus'" in r.stderr and "'system'" in r.stderr
          and "'session'" in r.stderr, f"DSD_BUS=bogus: rc={r.returncode} {r.stderr!r}")
    r = dsctl("--user", "status", DSD_BUS="bogus")
    check(r.returncode == 0, f"--user with DSD_BUS=bogus: rc={r.returncode} {r.stderr!r}")

    r = dsctl("--user", "status", "--json")
    st = json.loads(r.stdout) if r.returncode == 0 else {}
    check(st.get("State") == "ready" and st.get("Model") == "/models/b"
          and st.get("KVBlocksFree") == 100, f"dsctl status --json: {r.stdout} {r.stderr}")
    r = dsctl("status")
    check(r.returncode == 0 and "dsd 0.1.0-test — ready" in r.stdout
          and "Model: /models/b" in r.stdout and "3.0G of 80.0G used" in r.stdout,
          f"dsctl status: {r.stdout} {r.stderr}")
    r = dsctl("clients", "--json")
    cl = json.loads(r.stdout) if r.returncode == 0 else []
    check(len(cl) == 2 and cl[0]["comm"] == "chat" and cl[1]["tokens_total"] == 1200,
          f"dsctl clients --json: {r.stdout} {r.stderr}")
    r = dsctl("clients")
    check(r.returncode == 0 and "batchjob" in r.stdout, f"dsctl clients: {r.stdout}")
    r = dsctl("stats", "--json")
    check(r.returncode == 0 and json.loads(r.stdout).get("GeneratedTokensTotal") == 500,
          f"dsctl stats --json: {r.stdout} {r.stderr}")
    r = dsctl("drain")
    check(r.returncode == 0 and prop("State") == "draining", f"dsctl drain: {r.stderr}")
    r = dsctl("resume")
    check(r.returncode == 0 and prop("State") == "ready", f"dsctl resume: {r.stderr}")
    r = dsctl("cancel", "7")
    check(r.returncode == 0, f"dsctl cancel 7: {r.stderr}")
    r = dsctl("cancel", "8")
    check(r.returncode == 1 and "No request or client with id 8" in r.stderr,
          f"dsctl cancel 8: rc={r.returncode} {r.stderr}")
    model_dir = os.path.join(tmp, "modelc")
    os.mkdir(model_dir)
    r = subprocess.run([DSCTL, "reload", "modelc"], capture_output=True, text=True, env=env,
                       cwd=tmp, timeout=30)
    check(r.returncode == 0 and prop("Model") == model_dir,
          f"dsctl reload with a relative path: {r.stderr} {prop('Model')}")
    r = dsctl("reload", "/nonexistent/fail")
    check(r.returncode == 2 and "/nonexistent/fail" in r.stderr, f"dsctl reload missing dir: {r.stderr}")
    for args, why in [(["cancel"], "cancel without id"), (["cancel", "x"], "bad id"),
                      (["drain", "--json"], "--json on drain"), (["status", "extra"], "extra"),
                      (["status", "--frob"], "unknown option"), (["--json"], "no command"),
                      (["frob"], "unknown command")]:
        r = dsctl(*args)
        check(r.returncode == 2, f"dsctl {' '.join(args)} ({why}) should exit 2: {r.returncode}")

    # A daemon that is not running: exit 3.
    fake.terminate()
    check(fake.wait(timeout=10) == 0, "bus-fake-daemon did not exit 0 on SIGTERM")
    r = dsctl("status")
    check(r.returncode == 3 and "not running" in r.stderr,
          f"dsctl status without a daemon: rc={r.returncode} {r.stderr}")
    r = dsctl("status", "--user")
    check(r.returncode == 3, "--user")
    r = subprocess.run([DSCTL, "status"], capture_output=True, text=True, timeout=30,
                       env=dict(env, DBUS_SESSION_BUS_ADDRESS="unix:path=" + tmp + "/none"))
    check(r.returncode == 3, f"dsctl with no bus at all: rc={r.returncode} {r.stderr}")
finally:
    cleanup()

if failures:
    print(f"test-bus: {len(failures)} failure(s)", file=sys.stderr)
    sys.exit(1)
print("test-bus: ok")
