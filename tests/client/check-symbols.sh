#!/bin/sh
# The dynamic symbols libdsclient.so defines are exactly the names in its linker map.
set -eu
lib=$1
map=$2
got=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort)
want=$(sed -n 's/^[[:space:]]*\(ds_[a-z_]*\);$/\1/p' "$map" | sort)
if [ "$got" != "$want" ]; then
        echo "exported: $got" >&2
        echo "in the map: $want" >&2
        exit 1
fi
