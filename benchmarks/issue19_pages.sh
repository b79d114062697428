#!/usr/bin/env bash
# One short device call (issue 19, run 77): the fat split tasks (`--variants fat`) on the
# RG_MK_SPLIT_PAGES build whose fallback page load can no longer be hoisted (run 76's build
# loaded the table each token whatever `held` said, so its K/V addresses still waited on
# it), beside the 8-ahead builds, at b1 and b8 (every list bitwise its family's unfused
# list on the tree's default cubin); then, with the time left, the pages build's
# bit-for-bit gpu test. issue19_raw.sh's SET=fat, with run 77's limits. carry [".site"];
# results in $OUT.
SET=fat AB_LIMIT=${AB_LIMIT:-240} LIMIT=${LIMIT:-330} exec bash benchmarks/issue19_raw.sh
