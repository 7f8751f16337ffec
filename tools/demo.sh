#!/bin/sh
# The README's first command ends here: start dsd on the embedded synthetic model in a
# build directory, wait for its socket, stream one answer through libdsclient with
# `dsctl generate`, then stop the daemon with SIGTERM.
#   tools/demo.sh [BUILD_DIR] [PROMPT]
set -eu
build=${1:-build}
prompt=${2:-Once upon a time}
dir=$(mktemp -d)
sock=$dir/dsd.sock
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT

"$build/daemon/dsd" --model "$build/models/tiny" --socket "$sock" &
pid=$!
i=0
while [ ! -S "$sock" ]; do
        i=$((i + 1))
        if [ "$i" -gt 100 ] || ! kill -0 "$pid" 2>/dev/null; then
                echo "demo: dsd did not start" >&2
                exit 1
        fi
        sleep 0.1
done
echo "demo: dsd is serving $build/models/tiny (synthetic weights: the text is meaningless) on $sock" >&2
"$build/tools/dsctl/dsctl" generate --socket "$sock" --max-tokens 48 "$prompt"
echo
