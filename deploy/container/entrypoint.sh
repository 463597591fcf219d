#!/bin/sh
# deploy/container/entrypoint.sh - starts `paged serve` from the environment
# (PAGED_MODEL, PAGED_HOST, PAGED_PORT, PAGED_ARGS; PAGED_API_KEY is read by
# paged itself). Arguments given to `podman run IMAGE ...` are appended as
# further flags. exec: paged is PID 1's child-free process and gets SIGTERM.
set -eu
if [ ! -r "$PAGED_MODEL" ]; then
    echo "paged-entrypoint: model $PAGED_MODEL is not readable: mount a model directory at /models" \
         "(-v \$PWD/models:/models:ro) or set PAGED_MODEL" >&2
    exit 2
fi
# PAGED_ARGS is split into words on purpose (flags and values).
# shellcheck disable=SC2086
exec /usr/local/bin/paged serve --model "$PAGED_MODEL" --host "$PAGED_HOST" --port "$PAGED_PORT" \
    $PAGED_ARGS "$@"
