# SPDX-License-Identifier: MIT
# Minimal stdlib-only safetensors reading for the tool tests (no numpy on the test hosts).
import json
import struct
import subprocess
import sys

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(args, expect_ok=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    if not expect_ok and p.returncode == 0:
        fail("%s succeeded, expected a failure" % " ".join(args))
    return p


def read_safetensors(path):
    """Returns (header dict without __metadata__, metadata, data bytes), checking the
    layout the reference writer produces."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    check(n % 8 == 0, "%s: header length %d is not padded to 8" % (path, n))
    raw = blob[8:8 + n]
    check(raw.rstrip(b" ").endswith(b"}") and len(raw) - len(raw.rstrip(b" ")) < 8,
          "%s: header padding is not < 8 spaces" % path)
    header = json.loads(raw)
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    end = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        check(b == end, "%s: %s does not start where the previous tensor ends" % (path, name))
        numel = 1
        for d in t["shape"]:
            numel *= d
        check(e - b == numel * DTYPE_SIZE[t["dtype"]], "%s: %s has the wrong byte size" % (path, name))
        end = e
    check(end == len(data), "%s: data buffer is %d bytes, tensors end at %d" % (path, len(data), end))
    return header, meta, data


def tensor_bytes(header, data, name):
    b, e = header[name]["data_offsets"]
    return data[b:e]
