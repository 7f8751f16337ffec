#!/bin/sh
# Runs one fuzz harness over its corpus directories.
#   fuzz-run.sh replay BINARY CORPUS...     the replayer build (tests/fuzz_main.c)
#   fuzz-run.sh libfuzzer BINARY CORPUS...  a libFuzzer build, for FUZZ_SECONDS (default 30)
# libFuzzer writes new inputs into its first corpus directory, so it gets a scratch one
# and the committed corpora are only read.
set -eu
mode=$1 bin=$2
shift 2
case $mode in
replay)
        exec "$bin" "$@"
        ;;
libfuzzer)
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        mkdir "$scratch/new" "$scratch/artifacts"
        "$bin" -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=4096 -print_final_stats=1 \
                -error_exitcode=1 -timeout_exitcode=1 \
                -artifact_prefix="$scratch/artifacts/" "$scratch/new" "$@"
        ;;
*)
        echo "fuzz-run.sh: unknown mode '$mode'" >&2
        exit 2
        ;;
esac
