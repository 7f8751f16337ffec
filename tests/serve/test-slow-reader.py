#!/usr/bin/env python3
"""A client that stops reading: its requests are paused when its undelivered events reach
the bound, then failed with 'client too slow'; the others' tokens keep flowing."""
import json
import subprocess
import time

from serve_common import DSD, TOOL, Daemon, fail, run, wait_idle


def main(tmp, model):
    want = subprocess.run([DSD, "--model", model, "--backend", "cpu", "--generate",
                           "Once upon a time", "--max-tokens", "150"],
                          capture_output=True, check=True).stdout
    d = Daemon(tmp, model, "--client-buffer", "64", "--slow-timeout-ms", "500")
    try:
        slow = subprocess.Popen([TOOL, "noread", d.sock, "8", "400"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if slow.stdout.readline() != "submitted\n":
            fail("the slow client did not submit")
        # Until its requests fail, another client is served normally.
        n = 0
        deadline = time.monotonic() + 120
        while "too slow" not in d.text() or n < 3:
            if time.monotonic() > deadline:
                fail("the slow client was never failed:\n" + d.text())
            got = d.generate("Once upon a time", 150)
            if got != want:
                fail(f"the other client's output differs: {got!r}")
            n += 1
        print(f"{n} generations of another client while the slow one did not read")
        out, err = slow.communicate("go\n", timeout=120)
        if slow.returncode != 0:
            fail(f"serve-tool noread failed: {err}")
        res = json.loads(out)
        print(f"slow client: {res}")
        if res["too_slow"] < 1 or "client too slow" not in res["message"]:
            fail("the slow client's requests did not fail as too slow")
        info = wait_idle(d)
        if info["active"] or info["kv_free"] != info["kv_total"]:
            fail(f"requests or KV blocks are left behind: {info}")
    finally:
        rc = d.stop()
    log = d.text()
    if "pausing its requests" not in log or "too slow" not in log:
        fail("the pause and the failure were not logged:\n" + log)
    if rc != 0:
        fail(f"the daemon exited with {rc}\n{log}")
    print("ok")
    return 0


run(main)
