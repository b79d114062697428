"""The decision on a sealed bundle, one job per module, in the order they run:

* `freshness`: what moved in the reviewer's clone since the bundle was sealed;
* `rederive`: every gate's pure `derive` again on the sealed raw artifacts;
* `criteria`: the row's criteria, stop conditions and implementation admission,
  judged on the re-derived results, and the verdict they give;
* `review`: the orchestration: verify, freshness, re-derive, judge, sign the record;
* `attest`: the operator's signed statement on a reviewed bundle's hardware;
* `merge`: a local `git merge --no-ff` of an approved head, or the precondition
  that refused it;
* `record_files`: how a single-file record is written, signed and verified.
"""
