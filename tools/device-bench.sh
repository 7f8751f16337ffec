#!/bin/sh
# The GPU benchmark in one device command: builds with tools/device-build.sh, runs the gpu
# suite (a failing check stops here), writes the synthetic checkpoints, benches them, traces
# their batch-1 step kernel by kernel (libkernel-trace.so), serves them from dsd to dsbench
# (1 and 8 requests in flight, once the daemon serves: it listens while it loads) and
# prints the tables last. Logs
# go to $OUT (or /tmp). Shapes: qwen2-7b deepseek-v2-lite by default, qwen2-32b too with
# --full (decode batch 1 and prefill 2048 only: 78 GiB).
#   tools/device-bench.sh [--full]
set -u
out=${OUT:-/tmp}
full=0
[ "${1:-}" = "--full" ] && full=1
t0=$(date +%s)
tools/device-build.sh true || exit 1
echo "build: $(($(date +%s) - t0)) s"
export PKG_CONFIG_PATH=/tmp/sysroot/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/sysroot/usr/lib/x86_64-linux-gnu
q=build-dev/tools/dsquant/dsquant
bench=build-dev/tests/bench/bench-cuda
($q synth --shape qwen2-7b /tmp/q7 >"$out/synth-7b.log" 2>&1) &
($q synth --shape deepseek-v2-lite /tmp/v2l >"$out/synth-v2l.log" 2>&1) &
DSD_SHARED=$PWD/.device/shared meson test -C build-dev --suite gpu --print-errorlogs \
        >"$out/gpu.log" 2>&1
rc=$?
wait
grep -E "^ *[0-9]+/[0-9]+ " "$out/gpu.log"
[ $rc -eq 0 ] || { echo "gpu suite failed: $out/gpu.log"; exit 1; }
$bench /tmp/q7 >"$out/bench-7b.log" 2>&1
$bench /tmp/v2l >"$out/bench-v2l.log" 2>&1
# each kernel's share of the batch-1 step's critical path (tests/bench/kernel-trace.c)
trace=build-dev/tests/bench/libkernel-trace.so
if [ -f $trace ]; then
        for m in q7 v2l; do
                DSD_BENCH_ONLY=b1 CUDA_INJECTION64_PATH=$trace $bench /tmp/$m >/dev/null \
                        2>"$out/trace-$m.log"
        done
fi
build-dev/daemon/dsd --model /tmp/v2l --backend cuda --generate "The capital of" \
        --max-tokens 16 2>&1 >/dev/null | tr '\r' '\n' | tail -1
# dsd serving each model to dsbench: 1 and 8 requests in flight, 256 tokens at most each
for m in q7 v2l; do
        sock=/tmp/dsd-bench.sock
        rm -f $sock
        build-dev/daemon/dsd --model /tmp/$m --backend cuda --bus none --socket $sock \
                --kv-bytes 8589934592 --max-batch 64 >"$out/dsd-$m.log" 2>&1 &
        pid=$!
        # the socket listens while the model loads; the requests must not wait for it
        for i in $(seq 240); do grep -q "^Serving" "$out/dsd-$m.log" && break; sleep 0.25; done
        for c in 1 8; do
                echo "dsbench $m, $c in flight:"
                build-dev/tools/dsbench/dsbench --socket $sock --concurrency $c \
                        --requests $((3 * c)) --max-tokens 256 --rtt-rounds 100 2>&1 |
                        grep -E "throughput|first token|inter-token|delivery"
        done
        kill $pid
        wait $pid
done >"$out/serve.log" 2>&1
if [ $full = 1 ]; then
        rm -rf /tmp/q7 /tmp/v2l
        $q synth --shape qwen2-32b /tmp/q32 >"$out/synth-32b.log" 2>&1
        DSD_BENCH_ONLY=b1,p2048 $bench /tmp/q32 >"$out/bench-32b.log" 2>&1
        tail -13 "$out/bench-32b.log"
fi
tail -13 "$out/bench-7b.log"
tail -13 "$out/bench-v2l.log"
[ -f $trace ] && grep -h -A12 "^kernel-trace:" "$out/trace-q7.log" "$out/trace-v2l.log"
cat "$out/serve.log"
echo "total: $(($(date +%s) - t0)) s"
