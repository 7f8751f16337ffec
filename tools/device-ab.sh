#!/bin/sh
# Times git revisions against each other on the GPU device, in one device command, so that
# noise shows: every revision runs in turn, round after round, on the same checkpoints.
#
# Here:  tools/device-ab.sh pack [LABEL=]REV ...
#        writes .device/ab/LABEL.tgz for each revision (LABEL defaults to its short hash);
#        the first is the base. The device has no .git, so revisions travel as archives.
#        A file .device/ab/LABEL.env written after the pack (VAR=value lines) sets the
#        environment of LABEL's benches, so one revision can run under several settings.
# There: tools/device-ab.sh run [--shapes S,...] [--phases P,...] [--rounds N] [--gpu L,...]
#        [--memcheck L,...] [--trace L,...] [--trace-batch N] [--ncu L,...] [--sass L,...]
#        [--gemv]
#        (the run tool with carry [".deps", ".device"]): builds bench-cuda and dsquant of
#        every revision side by side, writes the checkpoints (dsquant synth --shape S with
#        the base's dsquant; default qwen2-7b,deepseek-v2-lite), runs bench-cuda with
#        DSD_BENCH_ONLY=P (default b1,b8,b64) and prints ms per decode step or per prefill
#        (rN: batch N's graph replayed back to back, the step without the host's part),
#        a line per revision and round (default 2), then a line per revision of its means
#        over the rounds and, after the base, their difference from the base's in %.
#        --gpu: first builds the revisions labelled L in full (their benches use those
#        builds) and runs their gpu suites (a failure is reported, the timing goes on).
#        --memcheck: then the gpu suites of those of them labelled L again under
#        compute-sanitizer memcheck (meson test --setup memcheck), each test's error and
#        leak summary counted in the output and the log kept as memcheck-L.txt.
#        --trace: after the benches, a batch-1 kernel trace (tests/bench/kernel-trace.c) of each
#        shape for the revisions labelled L, under their .env, its first lines printed (at batch
#        N with --trace-batch N). --ncu: after
#        those, Nsight Compute on the batch-1 GEMVs of each shape for the revisions labelled L (8
#        launches from the 400th, each alone at the base clock, so slower than in the step): a line
#        per launch (µs, DRAM TB/s, instructions issued a cycle a scheduler, warps an SM), the whole
#        report in the logs. --sass: the SASS of the CUDA kernels of the revisions labelled L
#        (cuobjdump -sass of their kernel library), into the logs as sass-L.txt, with the
#        instruction and MEMBAR counts of each GEMV kernel printed. --gemv: no checkpoints and no
#        bench-cuda; each revision's bench-gemv instead, round after round, its 1- and 8-row lines
#        printed (µs a launch). The logs come back as $OUT/ab-logs.tgz (a second run in the same
#        command: ab-logs-2.tgz, and so on) (the run tool returns at most 8 files); without $OUT
#        they stay in /tmp/ab.
set -eu

ab=.device/ab

usage() {
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        exit 2
}

pack() {
        [ $# -gt 0 ] || usage
        rm -rf "$ab"
        mkdir -p "$ab"
        for spec in "$@"; do
                rev=${spec#*=}
                label=$(git rev-parse --short "$rev")
                [ "$spec" != "$rev" ] && label=${spec%%=*}
                git archive --format=tar.gz -o "$ab/$label.tgz" "$rev"
                echo "$label" >>"$ab/order"
                echo "$ab/$label.tgz: $(git log -1 --format='%h %s' "$rev" | cut -c1-70)"
        done
}

# Where revision $1's bench-cuda and dsquant are built: its full build when --gpu named it.
bdir() {
        if [ -d "$work/full-$1/build-dev" ]; then
                echo "$work/full-$1/build-dev"
        else
                echo "$work/build-$1"
        fi
}

# The figure bench-cuda printed for phase p (bN: ms per decode step, rN: ms per replay of
# batch N's graph back to back, without the host's part; pN: ms per prompt).
figure() {
        case $2 in
        b*) grep "| decode batch ${2#b}," "$1" ;;
        r*) grep "| graph replays back to back, batch ${2#r} |" "$1" ;;
        p*) grep "| prefill ${2#p} " "$1" ;;
        esac | cut -d'|' -f3 | awk '{print $1}'
}

# the mean of label $2's figures of shape $3, phase $4 over $5 rounds in $1 (empty: none)
mean() {
        for r in $(seq "$5"); do
                figure "$1/bench-$2-$3-$r.log" "$4"
        done | awk '$1 > 0 { t += $1; n++ } END { if (n) printf "%.4f\n", t / n }'
}

run() {
        shapes=qwen2-7b,deepseek-v2-lite
        phases=b1,b8,b64
        rounds=2
        gpu=
        memcheck=
        trace=
        trace_batch=1
        ncu=
        sass=
        gemv=
        while [ $# -gt 0 ]; do
                n=2
                case $1 in
                --shapes) shapes=$2 ;;
                --phases) phases=$2 ;;
                --rounds) rounds=$2 ;;
                --gpu) gpu=$2 ;;
                --memcheck) memcheck=$2 ;;
                --trace) trace=$2 ;;
                --trace-batch) trace_batch=$2 ;;
                --ncu) ncu=$2 ;;
                --sass) sass=$2 ;;
                --gemv) gemv=1 n=1 ;;
                *) usage ;;
                esac
                [ $# -ge "$n" ] || usage
                shift "$n"
        done
        [ -f "$ab/order" ] || { echo "device-ab: no $ab/order: pack first"; exit 1; }
        out=/tmp/ab
        work=/tmp/ab-work
        root=$PWD
        rm -rf "$work" "$out"
        mkdir -p "$out" "$work"
        labels=$(cat "$ab/order")
        base=$(head -1 "$ab/order")

        t0=$(date +%s)
        # the full builds side by side, then the suites one after the other (one GPU)
        for l in $(echo "$gpu" | tr ',' ' '); do
                (
                        mkdir -p "$work/full-$l/.device" "$out/full-$l"
                        tar xzf "$ab/$l.tgz" -C "$work/full-$l"
                        cd "$work/full-$l"
                        ln -s "$root/.deps" .deps
                        ln -s "$root/.device/shared" .device/shared
                        OUT=$out/full-$l tools/device-build.sh true >"$out/full-$l/build.log" 2>&1
                ) &
        done
        wait
        for l in $(echo "$gpu" | tr ',' ' '); do
                (cd "$work/full-$l" && DSD_SHARED=$PWD/.device/shared timeout 600 \
                        meson test -C build-dev --suite gpu -t 3 --print-errorlogs) \
                        >"$out/gpu-$l.log" 2>&1 && echo "gpu suite of $l: passed" ||
                        echo "device-ab: gpu suite of $l FAILED: $out/gpu-$l.log"
                grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)" "$out/gpu-$l.log" || true
        done
        [ -n "$gpu" ] && echo "gpu suites: $(($(date +%s) - t0)) s"
        for l in $(echo "$memcheck" | tr ',' ' '); do
                if [ ! -d "$work/full-$l/build-dev" ]; then
                        echo "device-ab: --memcheck $l needs --gpu $l (its full build)"
                        continue
                fi
                (cd "$work/full-$l" && DSD_SHARED=$PWD/.device/shared timeout 900 \
                        meson test -C build-dev --setup memcheck --suite gpu --print-errorlogs) \
                        >"$out/memcheck-run-$l.log" 2>&1 && echo "memcheck of $l: passed" ||
                        echo "device-ab: memcheck of $l FAILED: $out/memcheck-$l.txt"
                cp "$work/full-$l/build-dev/meson-logs/testlog-memcheck.txt" \
                        "$out/memcheck-$l.txt" 2>/dev/null || true
                grep -h -E "ERROR SUMMARY|LEAK SUMMARY" "$out/memcheck-$l.txt" 2>/dev/null |
                        sort | uniq -c || true
        done
        [ -n "$memcheck" ] && echo "memcheck: $(($(date +%s) - t0)) s"
        for l in $labels; do
                [ -d "$work/full-$l/build-dev" ] && continue
                # the trace library where --trace names the revision
                lib=
                case ",$trace," in *",$l,"*) lib=tests/bench/libkernel-trace.so ;; esac
                (
                        mkdir -p "$work/src-$l"
                        tar xzf "$ab/$l.tgz" -C "$work/src-$l"
                        cd "$work/src-$l"
                        meson setup "$work/build-$l" -Dcuda=enabled \
                                -Dshared_dir="$root/.device/shared" >"$out/setup-$l.log" 2>&1 &&
                                ninja -C "$work/build-$l" tests/bench/bench-cuda \
                                        tests/bench/bench-gemv tools/dsquant/dsquant $lib \
                                        >"$out/ninja-$l.log" 2>&1 ||
                                echo "device-ab: $l did not build: $out/ninja-$l.log"
                ) &
        done
        wait
        echo "builds: $(($(date +%s) - t0)) s"
        for l in $(echo "$sass" | tr ',' ' '); do
                cuobjdump -sass "$(bdir "$l")/kernels/libdskernels.a" >"$out/sass-$l.txt" 2>&1 || true
                echo "sass of $l (instructions, of them MEMBAR, a GEMV kernel):"
                awk 'function put() { if (f) printf "  %6d %3d %s\n", n, m, f }
                        /Function : / { put(); f = $NF ~ /k_gemv/ ? $NF : ""; n = m = 0; next }
                        f && /^[ \t]+\/\*[0-9a-f][0-9a-f][0-9a-f][0-9a-f]\*\// { n++ }
                        f && /MEMBAR/ { m++ }
                        END { put() }' "$out/sass-$l.txt"
        done
        if [ -n "$gemv" ]; then
                for r in $(seq "$rounds"); do
                        for l in $labels; do
                                (
                                        [ -f "$ab/$l.env" ] && set -a && . "$root/$ab/$l.env"
                                        "$(bdir "$l")/tests/bench/bench-gemv"
                                ) >"$out/gemv-$l-$r.log" 2>&1 || true
                        done
                done
                echo "benches: $(($(date +%s) - t0)) s"
                head -1 "$out/gemv-$base-1.log" | sed 's/^/revision round /'
                for l in $labels; do
                        for r in $(seq "$rounds"); do
                                awk -v l="$l" -v r="$r" \
                                        'NR > 1 && ($(NF - 4) == 1 || $(NF - 4) == 8) { print l, r, $0 }' \
                                        "$out/gemv-$l-$r.log"
                        done
                done
        else
                for s in $(echo "$shapes" | tr ',' ' '); do
                        "$(bdir "$base")/tools/dsquant/dsquant" synth --shape "$s" "$work/ck-$s" \
                                >"$out/synth-$s.log" 2>&1 &
                done
                wait
                echo "checkpoints: $(($(date +%s) - t0)) s"

                for r in $(seq "$rounds"); do
                        for l in $labels; do
                                for s in $(echo "$shapes" | tr ',' ' '); do
                                        (
                                                [ -f "$ab/$l.env" ] && set -a && . "$root/$ab/$l.env"
                                                DSD_BENCH_ONLY=$(echo "$phases" | sed 's/r/b/g') \
                                                        "$(bdir "$l")/tests/bench/bench-cuda" \
                                                        "$work/ck-$s"
                                        ) >"$out/bench-$l-$s-$r.log" 2>&1 || true
                                done
                        done
                done
                echo "benches: $(($(date +%s) - t0)) s"

                for s in $(echo "$shapes" | tr ',' ' '); do
                        echo "$s (ms: decode per step, prefill per prompt)"
                        printf "%-12s %5s" revision round
                        for p in $(echo "$phases" | tr ',' ' '); do printf " %9s" "$p"; done
                        echo
                        for l in $labels; do
                                for r in $(seq "$rounds"); do
                                        printf "%-12s %5s" "$l" "$r"
                                        for p in $(echo "$phases" | tr ',' ' '); do
                                                v=$(figure "$out/bench-$l-$s-$r.log" "$p")
                                                printf " %9s" "${v:--}"
                                        done
                                        echo
                                done
                        done
                        for l in $labels; do
                                printf "%-12s %5s" "$l" mean
                                d=
                                for p in $(echo "$phases" | tr ',' ' '); do
                                        m=$(mean "$out" "$l" "$s" "$p" "$rounds")
                                        b=$(mean "$out" "$base" "$s" "$p" "$rounds")
                                        printf " %9s" "${m:--}"
                                        pct=
                                        [ -n "$m" ] && [ -n "$b" ] &&
                                                pct=$(awk -v m="$m" -v b="$b" \
                                                        'BEGIN { printf "%+.2f%%", 100 * (m - b) / b }')
                                        d="$d $(printf "%9s" "${pct:--}")"
                                done
                                echo
                                [ "$l" != "$base" ] && printf "%-12s %5s%s\n" "$l" "%" "$d"
                        done
                done
                for l in $(echo "$trace" | tr ',' ' '); do
                        for s in $(echo "$shapes" | tr ',' ' '); do
                                (
                                        [ -f "$ab/$l.env" ] && set -a && . "$root/$ab/$l.env"
                                        DSD_BENCH_ONLY=b$trace_batch \
                                                CUDA_INJECTION64_PATH="$(bdir "$l")/tests/bench/libkernel-trace.so" \
                                                "$(bdir "$l")/tests/bench/bench-cuda" "$work/ck-$s" \
                                                >/dev/null 2>"$out/trace-$l-$s.log"
                                ) || true
                                echo "trace of $l, $s, batch $trace_batch:"
                                head -16 "$out/trace-$l-$s.log"
                        done
                done
                for l in $(echo "$ncu" | tr ',' ' '); do
                        for s in $(echo "$shapes" | tr ',' ' '); do
                                (
                                        [ -f "$ab/$l.env" ] && set -a && . "$root/$ab/$l.env"
                                        DSD_BENCH_ONLY=b1 timeout 300 ncu --kernel-name-base demangled \
                                                --kernel-name regex:'k_gemv' --launch-skip 400 \
                                                --launch-count 8 --section SpeedOfLight \
                                                --section Occupancy --section LaunchStats \
                                                --section WarpStateStats --section SchedulerStats \
                                                --section WorkloadDistribution \
                                                --section MemoryWorkloadAnalysis \
                                                "$(bdir "$l")/tests/bench/bench-cuda" "$work/ck-$s"
                                ) >"$out/ncu-$l-$s.txt" 2>&1 || true
                                echo "ncu of $l, $s, batch 1 (us, DRAM TB/s, issued, warps an SM):"
                                awk '/^  void k_/ { sub(/^  void /, ""); sub(/\(.*/, ""); k = $0 }
                                        /^    Duration / { d = $NF }
                                        /^    Memory Throughput +Tbyte\/s/ { m = $NF }
                                        /^    Issued Warp Per Scheduler/ { i = $NF }
                                        /^    Achieved Active Warps Per SM/ {
                                                printf "  %-28s %8s %6s %6s %6s\n", k, d, m, i, $NF }' \
                                        "$out/ncu-$l-$s.txt"
                        done
                done
        fi
        if [ -n "${OUT:-}" ]; then
                # a second run in the same device command keeps the first one's logs
                logs=$OUT/ab-logs.tgz n=1
                while [ -e "$logs" ]; do
                        n=$((n + 1))
                        logs=$OUT/ab-logs-$n.tgz
                done
                tar czf "$logs" -C "$(dirname "$out")" "$(basename "$out")"
        fi
}

case ${1:-} in
pack)
        shift
        pack "$@"
        ;;
run)
        shift
        # the -dev libraries' sysroot and environment of device-build.sh, without its build
        if [ -z "${DSD_AB_ENV:-}" ]; then
                DSD_AB_ENV=1 exec tools/device-build.sh -n "$0" run "$@"
        fi
        run "$@"
        ;;
*) usage ;;
esac
