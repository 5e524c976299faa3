#!/usr/bin/env bash
# run-0517.sh: run-0523.sh's steps on SGLang 0.5.17 over the GPU host image's own torch 2.11.0
# (make-bundle.sh 0517: one part, .gpu517/p00, installed into /tmp/site517). Same steps, same
# arguments, same $OUT layout (README.md beside this file, "The host image's own stack").
HSDUMP_STACK=0517 exec bash "$(dirname "$0")/run-0523.sh" "$@"
