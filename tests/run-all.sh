#!/bin/sh
# The whole default test run, as README.md and CI give it:
#  1. a gcc build with -Werror, every suite but gpu and bench;
#  2. the same suites under AddressSanitizer + UndefinedBehaviorSanitizer;
#  3. the fuzz harnesses as real libFuzzer binaries (clang), for a bounded time each.
#  4. the .deb and .rpm packages (CPU backend), built and their listings checked, plus
#     systemd-analyze verify of the units (tests/service/test-packaging.sh).
# Build directories live under build-test/ so they never disturb a developer's build/.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
suites="--no-suite gpu --no-suite bench"

step() { printf '\n=== %s\n' "$*"; }

step "gcc, -Werror"
meson setup build-test/release --wipe -Dwerror=true -Dcuda=disabled >/dev/null 2>&1 ||
        meson setup build-test/release -Dwerror=true -Dcuda=disabled
ninja -C build-test/release -j "$jobs"
meson test -C build-test/release $suites --num-processes "$jobs" --print-errorlogs

step "AddressSanitizer + UndefinedBehaviorSanitizer"
meson setup build-test/asan --wipe -Dwerror=true -Dcuda=disabled -Dbuildtype=debug \
        -Db_sanitize=address,undefined -Db_lundef=false >/dev/null 2>&1 ||
        meson setup build-test/asan -Dwerror=true -Dcuda=disabled -Dbuildtype=debug \
                -Db_sanitize=address,undefined -Db_lundef=false
ninja -C build-test/asan -j "$jobs"
meson test -C build-test/asan $suites --num-processes "$jobs" --print-errorlogs \
        --timeout-multiplier 4

step "libFuzzer harnesses (clang)"
CC=clang meson setup build-test/fuzz --wipe -Dcuda=disabled -Dfuzzing=true \
        -Db_sanitize=address,undefined -Db_lundef=false >/dev/null 2>&1 ||
        CC=clang meson setup build-test/fuzz -Dcuda=disabled -Dfuzzing=true \
                -Db_sanitize=address,undefined -Db_lundef=false
ninja -C build-test/fuzz -j "$jobs"
meson test -C build-test/fuzz --suite fuzz --num-processes "$jobs" --print-errorlogs

step "packages: .deb and .rpm without CUDA"
pkg_status=0
packaging/build-packages.sh --cuda=disabled build-test/packages || pkg_status=1

# One closing line over all three runs and the packages, in the plain form CI tools read.
python3 - "$pkg_status" build-test/release build-test/asan build-test/fuzz <<'PY'
import json, sys
passed = failed = skipped = 0
if sys.argv.pop(1) == "0":
    passed += 1
else:
    failed += 1
for d in sys.argv[1:]:
    for line in open(d + "/meson-logs/testlog.json", encoding="utf-8"):
        r = json.loads(line)["result"]
        if r == "OK":
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
