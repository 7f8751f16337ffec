#!/usr/bin/env python3
"""20 clients killed with SIGKILL mid-stream: afterwards the daemon serves new requests,
ds_server_info shows no active request and every KV block free, and its open-fd count is
back to where it started."""
import subprocess
import time

from serve_common import DSD, TOOL, Daemon, fail, run, wait_idle

N = 20


def main(tmp, model):
    d = Daemon(tmp, model)
    try:
        # Daemon() probed the socket with a connection of its own; under load the daemon
        # may not have closed it yet, and counting it would make the baseline one too high.
        deadline = time.monotonic() + 10
        while "closed: end of stream" not in d.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        fds0 = d.fds()
        procs = [subprocess.Popen([TOOL, "stream", d.sock, f"Once upon a time {i}", "400", "5"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for i in range(N)]
        for p in procs:
            line = p.stderr.readline()
            if line != b"started\n":
                fail(f"a streaming client did not start: {line!r}")
        mid = d.info()
        print(f"streaming: {mid}")
        if mid["active"] + mid["queued"] == 0:
            fail("nothing was in flight when the clients were killed")
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            p.stderr.close()

        want = subprocess.run([DSD, "--model", model, "--backend", "cpu", "--generate",
                               "Once upon a time", "--max-tokens", "100"],
                              capture_output=True, check=True).stdout
        got = d.generate("Once upon a time", 100)
        if got != want:
            fail(f"a new request after the kills differs: {got!r} vs {want!r}")
        info = wait_idle(d)
        print(f"after: {info}")
        if info["active"] != 0 or info["queued"] != 0 or info["kv_free"] != info["kv_total"]:
            fail("requests or KV blocks are left behind")
        deadline = time.monotonic() + 10
        while d.fds() != fds0 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"open fds: {fds0} at start, {d.fds()} now")
        if d.fds() != fds0:
            fail(f"open fds {d.fds()} != {fds0}:\n" + d.text())
        if not d.alive():
            fail("the daemon died")
    finally:
        rc = d.stop()
    log = d.text()
    if rc != 0:
        fail(f"the daemon exited with {rc}\n{log}")
    print(f"ok: {log.count('disconnected')} disconnections logged")
    return 0


run(main)
