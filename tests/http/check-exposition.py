#!/usr/bin/env python3
"""A strict parser of the Prometheus text exposition format 0.0.4, for the test suite
(prometheus_client is not a dependency). parse(text) returns {family: {"type", "help",
"samples": [(name, labels, value)]}} or raises ValueError naming the line. Run as a
program it checks the output of test-metrics against the known workload."""
import math
import re
import subprocess
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(s, where):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise ValueError(f"{where}: bad value {s!r}")
    return float(s)


def parse_labels(s, where):
    labels = {}
    i = 0
    while i < len(s):
        m = re.compile(LABEL + "=\"").match(s, i)
        if not m:
            raise ValueError(f"{where}: bad label at {s[i:]!r}")
        name = s[i:m.end() - 2]
        i = m.end()
        val = []
        while True:
            if i >= len(s):
                raise ValueError(f"{where}: unterminated label value")
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ValueError(f"{where}: bad escape \\{nxt}")
                val.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise ValueError(f"{where}: raw newline in label value")
            else:
                val.append(c)
                i += 1
        if name in labels:
            raise ValueError(f"{where}: duplicate label {name}")
        labels[name] = "".join(val)
        if i < len(s):
            if s[i] != ",":
                raise ValueError(f"{where}: expected ',' in labels")
            i += 1
    return labels


def family_of(name, families):
    for suffix in ("_bucket", "_sum", "_count", ""):
        if suffix and name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in families and families[base]["type"] in ("histogram", "summary"):
                return base
    return name


def parse(text):
    if not text.endswith("\n"):
        raise ValueError("the text must end with a newline")
    families = {}
    seen_samples = set()
    for no, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {no}"
        if line == "":
            continue
        if line.startswith("#"):
            m = re.fullmatch(r"# (HELP|TYPE) (" + NAME + r") (.*)", line)
            if not m:
                if line.startswith("# HELP") or line.startswith("# TYPE"):
                    raise ValueError(f"{where}: malformed {line!r}")
                continue
            kind, name, rest = m.groups()
            f = families.setdefault(name, {"type": None, "help": None, "samples": []})
            if f["samples"]:
                raise ValueError(f"{where}: {kind} for {name} after its samples")
            if kind == "TYPE":
                if f["type"] is not None or rest not in TYPES:
                    raise ValueError(f"{where}: bad or repeated TYPE {rest!r}")
                f["type"] = rest
            else:
                if f["help"] is not None:
                    raise ValueError(f"{where}: repeated HELP")
                f["help"] = rest
            continue
        m = re.fullmatch(r"(" + NAME + r")(\{(.*)\})? (\S+)( -?\d+)?", line)
        if not m:
            raise ValueError(f"{where}: malformed sample {line!r}")
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        labels = parse_labels(labels or "", where)
        key = (name, tuple(sorted(labels.items())))
        if key in seen_samples:
            raise ValueError(f"{where}: duplicate sample {key}")
        seen_samples.add(key)
        fam = family_of(name, families)
        if fam not in families or families[fam]["type"] is None:
            raise ValueError(f"{where}: sample {name} without TYPE")
        families[fam]["samples"].append((name, labels, parse_value(value, where)))
    for name, f in families.items():
        check_family(name, f)
    return families


def check_family(name, f):
    if f["type"] == "counter":
        for s, _, v in f["samples"]:
            if s != name or v < 0 or math.isnan(v):
                raise ValueError(f"counter {name}: bad sample {s} {v}")
    if f["type"] != "histogram":
        return
    groups = {}
    for s, labels, v in f["samples"]:
        rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        g = groups.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if s == name + "_bucket":
            if "le" not in labels:
                raise ValueError(f"{name}: bucket without le")
            g["buckets"].append((parse_value(labels["le"], name), v))
        elif s == name + "_sum":
            g["sum"] = v
        elif s == name + "_count":
            g["count"] = v
        else:
            raise ValueError(f"{name}: stray sample {s}")
    for rest, g in groups.items():
        b = g["buckets"]
        if not b or b[-1][0] != math.inf:
            raise ValueError(f"{name}{rest}: no +Inf bucket last")
        if [x for x, _ in b] != sorted(x for x, _ in b):
            raise ValueError(f"{name}{rest}: buckets out of order")
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise ValueError(f"{name}{rest}: buckets not cumulative")
        if g["count"] is None or g["sum"] is None or g["count"] != b[-1][1]:
            raise ValueError(f"{name}{rest}: _count must equal the +Inf bucket")


def value(families, name, **labels):
    fam = family_of(name, families)
    for s, l, v in families[fam]["samples"]:
        if s == name and all(l.get(k) == x for k, x in labels.items()):
            return v
    raise KeyError(f"{name}{labels}")


def main():
    text = subprocess.run([sys.argv[1]], capture_output=True, text=True, check=True).stdout
    fams = parse(text)
    model = 'mod"el\\x\ny'
    for name, f in fams.items():
        if not name.startswith("dsd_") or not f["help"]:
            raise ValueError(f"{name}: no dsd_ prefix or no HELP")
        for _, labels, _ in f["samples"]:
            assert labels["model"] == model, labels
    checks = {
        ("dsd_generation_tokens_total", ()): 3,
        ("dsd_prompt_tokens_total", ()): 5,
        ("dsd_preemptions_total", ()): 1,
        ("dsd_reloads_total", ()): 2,
        ("dsd_client_violations_total", ()): 1,
        ("dsd_kv_cache_usage_ratio", ()): 0.25,
        ("dsd_requests_finished_total", (("reason", "length"),)): 1,
        ("dsd_requests_finished_total", (("reason", "error"),)): 1,
        ("dsd_requests_finished_total", (("reason", "stop"),)): 0,
        ("dsd_inter_token_latency_seconds_count", ()): 2,
        ("dsd_inter_token_latency_seconds_bucket", (("le", "0.001"),)): 2,
        ("dsd_inter_token_latency_seconds_bucket", (("le", "0.00050000000000000001"),)): 0,
        ("dsd_time_to_first_token_seconds_bucket", (("le", "0.025000000000000001"),)): 0,
        ("dsd_time_to_first_token_seconds_bucket", (("le", "0.050000000000000003"),)): 1,
        ("dsd_e2e_request_latency_seconds_count", ()): 2,
        ("dsd_e2e_request_latency_seconds_bucket", (("le", "320"),)): 1,
        ("dsd_e2e_request_latency_seconds_bucket", (("le", "+Inf"),)): 2,
        ("dsd_request_queue_time_seconds_sum", ()): 0.002,
    }
    for (name, labels), want in checks.items():
        got = value(fams, name, **dict(labels))
        if abs(got - want) > 1e-9:
            raise ValueError(f"{name}{dict(labels)} = {got}, want {want}")
    # The checker itself refuses what it should.
    for bad in ["x 1\n", "# TYPE x counter\nx -1\n", "# TYPE x gauge\nx{a=\"\\q\"} 1\n",
                "# TYPE x gauge\nx 1", "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_count 2\nh_sum 1\n",
                "# TYPE x gauge\nx 1\nx 2\n", "# TYPE x gauge\nx{a=\"1\"b=\"2\"} 1\n"]:
        try:
            parse(bad)
        except ValueError:
            continue
        raise AssertionError(f"checker accepted {bad!r}")
    print(f"ok: {len(fams)} families")


if __name__ == "__main__":
    main()
