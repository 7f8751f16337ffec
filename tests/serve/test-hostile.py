#!/usr/bin/env python3
"""Hostile clients: one maps its segment and scribbles random words over it (cursors,
lengths, offsets near 2^32) while submitting; others write random bytes to the socket,
before and after the handshake. Each is disconnected as a protocol violation, while the
daemon and an honest client running beside them are unaffected."""
import random
import socket
import struct
import subprocess
import threading

from serve_common import DSD, TOOL, Daemon, fail, run, wait_idle

HELLO = struct.Struct("<IHHII32s")
MAGIC = 0x31445344


def hello(mode, version=1):
    body = HELLO.pack(MAGIC, version, mode, 0, 0, b"hostile")
    return struct.pack("<I", len(body)) + body


def closed_by_daemon(s, timeout=10):
    """True once the daemon closes the connection (EOF or reset)."""
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def socket_garbage(path, seed, handshake):
    rnd = random.Random(seed)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if handshake:
        s.sendall(hello(2))
        n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
        welcome = s.recv(n, socket.MSG_WAITALL)
        if struct.unpack_from("<I", welcome, 8)[0] != 0:
            fail("the socket-mode handshake was refused")
        # A frame of a plausible length, then garbage that cannot be a valid record.
        payload = struct.pack("<I", 256 + rnd.randrange(1024))
    else:
        payload = b""
    payload += bytes(rnd.getrandbits(8) for _ in range(8192))
    try:
        s.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass
    ok = closed_by_daemon(s)
    s.close()
    return ok


def main(tmp, model):
    want = subprocess.run([DSD, "--model", model, "--backend", "cpu", "--generate",
                           "Once upon a time", "--max-tokens", "120"],
                          capture_output=True, check=True).stdout
    d = Daemon(tmp, model)
    honest_bad = []
    stop = threading.Event()

    def honest():
        n = 0
        while not stop.is_set() or n < 5:
            got = d.generate("Once upon a time", 120)
            if got != want:
                honest_bad.append(got)
            n += 1
        print(f"honest client: {n} generations")

    try:
        t = threading.Thread(target=honest)
        t.start()
        kicked = 0
        for seed in range(1, 7):
            p = subprocess.run([TOOL, "hostile", d.sock, str(seed)], capture_output=True,
                               text=True, timeout=60)
            print(f"hostile ring client seed {seed}: exit {p.returncode}, "
                  f"{p.stdout.strip()} {p.stderr.strip()}")
            kicked += p.returncode == 0
        for seed in range(1, 5):
            for handshake in (False, True):
                if not socket_garbage(d.sock, seed, handshake):
                    fail(f"random socket bytes (seed {seed}, after handshake {handshake}) "
                         "did not get the client disconnected")
        stop.set()
        t.join()
        if honest_bad:
            fail(f"the honest client got different output: {honest_bad[0]!r}")
        if not d.alive():
            fail("the daemon died:\n" + d.text())
        info = wait_idle(d)
        print(f"after: {info}")
        if info["active"] or info["queued"] or info["kv_free"] != info["kv_total"]:
            fail("requests or KV blocks are left behind")
    finally:
        stop.set()
        rc = d.stop()
    log = d.text()
    violations = log.count("protocol violation")
    print(f"{violations} protocol violations logged; {kicked} of 6 ring clients disconnected")
    if rc != 0:
        fail(f"the daemon exited with {rc}\n{log}")
    # A ring client may also notice its own scribbles first (its library closes with
    # -EPROTO): either way it is gone, and the daemon counted the rest as violations.
    if kicked != 6 or violations < 1 + 8:
        fail("not every hostile client was disconnected:\n" + log)
    return 0


run(main)
