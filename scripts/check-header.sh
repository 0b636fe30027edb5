#!/usr/bin/env bash
# Regenerates ffi/include/mesos_gpu.h with the pinned cbindgen and fails when the checked-in
# header differs (run with --fix to write it instead). Installs the pinned cbindgen when it is
# missing, into $MGPU_TOOLS_DIR (default: $CARGO_HOME, i.e. ~/.cargo) with `cargo install`.
set -euo pipefail

CBINDGEN_VERSION=0.29.4
repo=$(cd "$(dirname "$0")/.." && pwd)
header="$repo/ffi/include/mesos_gpu.h"
tools="${MGPU_TOOLS_DIR:-${CARGO_HOME:-$HOME/.cargo}}"

find_cbindgen() {
    local c
    for c in "${CBINDGEN:-}" "$tools/bin/cbindgen" "$(command -v cbindgen || true)"; do
        if [[ -n "$c" && -x "$c" && "$("$c" --version)" == "cbindgen $CBINDGEN_VERSION" ]]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

if ! cbindgen=$(find_cbindgen); then
    echo "check-header: installing cbindgen $CBINDGEN_VERSION into $tools" >&2
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --root "$tools" >&2
    cbindgen=$(find_cbindgen)
fi

fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
(cd "$repo/ffi" && "$cbindgen" --quiet --config cbindgen.toml --crate mesos-gpu-ffi --output "$fresh")

if [[ "${1:-}" == "--fix" ]]; then
    cp "$fresh" "$header"
    echo "check-header: wrote $header"
elif cmp -s "$fresh" "$header"; then
    echo "check-header: $header is up to date"
else
    echo "check-header: $header is stale; regenerate it with scripts/check-header.sh --fix" >&2
    diff -u "$header" "$fresh" >&2 || true
    exit 1
fi
