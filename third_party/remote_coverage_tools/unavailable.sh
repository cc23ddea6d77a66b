#!/bin/sh
echo "coverage is not available in this offline Bazel build (no @remote_coverage_tools)" >&2
exit 1
