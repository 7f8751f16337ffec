#!/usr/bin/env python3
"""Handshake refusals: a client speaking another protocol version gets a welcome with
status 'version' and a message naming both versions; a uid outside the allow-list
(nobody, when we run as root) is refused with a logged reason."""
import os
import socket
import struct
import subprocess

from serve_common import TOOL, Daemon, fail, run

DS_ERR_DENIED = -(8192 + 7)
WIRE_ERR_VERSION = 6


def main(tmp, model):
    d = Daemon(tmp, model)
    skipped = None
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        body = struct.pack("<IHHII32s", 0x31445344, 99, 1, os.getpid(), 0, b"old")
        s.sendall(struct.pack("<I", len(body)) + body)
        n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
        w = s.recv(n, socket.MSG_WAITALL)
        status = struct.unpack_from("<I", w, 8)[0]
        version = struct.unpack_from("<H", w, 4)[0]
        msg = w[16:208].split(b"\0")[0].decode()
        print(f"version 99: status {status}, daemon version {version}, {msg!r}")
        if status != WIRE_ERR_VERSION or "99" not in msg or str(version) not in msg:
            fail("a wrong protocol version did not get a clear refusal")
        if s.recv(1) != b"":
            fail("the connection stayed open after the refusal")
        s.close()

        if os.geteuid() != 0:
            skipped = "not root: cannot run a client as another uid"
        else:
            probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534",
                                    "--clear-groups", TOOL], capture_output=True)
            if probe.returncode != 2:
                skipped = "nobody cannot run the test client from this build directory"
        if not skipped:
            p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                TOOL, "connect", d.sock], capture_output=True, text=True,
                               timeout=30)
            print(f"as nobody: {p.stdout.strip()}")
            code = int(p.stdout.split(" ", 1)[0])
            if code != DS_ERR_DENIED or "not allowed" not in p.stdout:
                fail("a disallowed uid was not refused with a reason")
    finally:
        rc = d.stop()
    log = d.text()
    if "protocol version 99 is not supported" not in log:
        fail("the version refusal was not logged:\n" + log)
    if not skipped and "uid 65534 gid 65534 is not allowed" not in log:
        fail("the uid refusal was not logged:\n" + log)
    if rc != 0:
        fail(f"the daemon exited with {rc}\n{log}")
    if skipped:
        print(f"uid check skipped: {skipped}")
    print("ok")
    return 0


run(main)
