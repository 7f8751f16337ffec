#!/usr/bin/env python3
"""The daemon killed with SIGKILL while a client is blocked in ds_next() without a
timeout: ds_next() returns an error within 100 ms."""
import subprocess
import time

from serve_common import TOOL, Daemon, fail, run

LIMIT_MS = 100


def main(tmp, model):
    worst = 0.0
    for trial in range(3):
        d = Daemon(tmp, model)
        try:
            p = subprocess.Popen([TOOL, "block", d.sock], stdout=subprocess.PIPE, text=True)
            if p.stdout.readline() != "ready\n":
                fail("the blocking client did not connect")
            time.sleep(0.3)  # well inside ds_next() by now
            t0 = time.monotonic_ns()
        finally:
            d.kill()
        out, _ = p.communicate(timeout=10)
        rc, t1 = (int(x) for x in out.split())
        ms = (t1 - t0) / 1e6
        worst = max(worst, ms)
        print(f"trial {trial}: ds_next returned {rc} {ms:.1f} ms after the kill")
        if rc >= 0:
            fail("ds_next did not report the dead daemon")
    if worst > LIMIT_MS:
        fail(f"ds_next took {worst:.1f} ms, more than {LIMIT_MS} ms")
    print(f"ok: worst {worst:.1f} ms")
    return 0


run(main)
