#!/usr/bin/env bash
# `bash tests/gpu/session10_call.sh memviz` runs this: the memory_viz size table (memviz_size.sh).
exec bash "$(dirname "$0")/memviz_size.sh" "$@"
