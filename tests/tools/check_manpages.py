#!/usr/bin/env python3
"""The manual pages (docs/man) against what they describe:
- each renders under groff's warnings (-ww) without one;
- every long option a program's --help, or one of its commands' --help, lists is a .TP
  entry of its page, and every option a .TP entry documents is one those helps list;
- dsd.json(5) has a .TP entry for every field of daemon/config.c's table and for every
  member of the http object that daemon/http/listener.c accepts, and none for a field
  that does not exist.
Usage: check_manpages.py DSCTL DSBENCH (DSD, DSQUANT and DSD_SOURCE from the environment)."""
import os
import re
import subprocess
import sys

dsctl, dsbench = sys.argv[1], sys.argv[2]
src = os.environ["DSD_SOURCE"]
man = os.path.join(src, "docs", "man")
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond


def help_options(argv):
    """The long options of a help text's option entries: an indented line whose first
    column (up to a gap of two spaces) names them, as '  -h, --help  this text'."""
    out = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        check(False, f"{' '.join(argv)} --help exits 0 (got {out.returncode})")
        return set()
    opts = set()
    for line in out.stdout.splitlines():
        m = re.match(r"^ {2,}(-\S.*?)(?: {2,}|$)", line)
        if m:
            opts |= set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", m.group(1)))
    return opts


def page_entries(page):
    """The tag lines of a page's .TP entries, with roff's \\- read as '-'."""
    lines = open(os.path.join(man, page), encoding="utf-8").read().splitlines()
    return [lines[i + 1].replace("\\-", "-") for i, line in enumerate(lines[:-1])
            if line.startswith(".TP")]


def page_options(page):
    opts = set()
    for tag in page_entries(page):
        opts |= set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", tag))
    return opts


def compare(page, helps):
    documented = page_options(page)
    missing = sorted(helps - documented)
    extra = sorted(documented - helps)
    check(not missing, f"{page} documents every option of the help texts"
          + (f" (missing: {', '.join('--' + o for o in missing)})" if missing else ""))
    check(not extra, f"{page} documents no option the help texts lack"
          + (f" (extra: {', '.join('--' + o for o in extra)})" if extra else ""))


pages = sorted(os.listdir(man))
check(pages == ["dsbench.1", "dsctl.1", "dsd.8", "dsd.json.5", "dsquant.1"],
      f"docs/man holds the five pages ({', '.join(pages)})")
for page in pages:
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", os.path.join(man, page)],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and not r.stderr.strip(),
          f"{page} renders without a warning" + (f": {r.stderr.strip()}" if r.stderr.strip() else ""))

dsd, dsquant = os.environ["DSD"], os.environ["DSQUANT"]
compare("dsd.8", help_options([dsd]))
compare("dsbench.1", help_options([dsbench]))
helps = help_options([dsquant])
for cmd in ("convert", "synth", "inspect", "tokenize", "detokenize", "eval"):
    helps |= help_options([dsquant, cmd])
compare("dsquant.1", helps)
helps = help_options([dsctl])
for cmd in ("generate", "chat", "status"):
    helps |= help_options([dsctl, cmd])
compare("dsctl.1", helps)

# dsd.json(5): the fields as the code's own tables name them.
config_c = open(os.path.join(src, "daemon", "config.c"), encoding="utf-8").read()
fields = set(re.findall(r'^\s*F\("([a-z0-9_.]+)"', config_c, re.M))
listener_c = open(os.path.join(src, "daemon", "http", "listener.c"), encoding="utf-8").read()
known = re.search(r"known\[\] = \{([^}]*)\}", listener_c)
http = set(re.findall(r'"([a-z0-9_]+)"', known.group(1))) if known else set()
check(len(fields) >= 20 and len(http) >= 7,
      f"config.c names {len(fields)} fields and listener.c {len(http)} http members")
want = fields | {"http"} | {"http." + m for m in http}
tags = set()
for tag in page_entries("dsd.json.5"):
    m = re.match(r"^\.B ([a-z0-9_.]+)$", tag)
    if m:
        tags.add(m.group(1))
missing, extra = sorted(want - tags), sorted(tags - want)
check(not missing, "dsd.json.5 has an entry for every field"
      + (f" (missing: {', '.join(missing)})" if missing else ""))
check(not extra, "dsd.json.5 has no entry for a field that does not exist"
      + (f" (extra: {', '.join(extra)})" if extra else ""))

sys.exit(1 if failures else 0)
