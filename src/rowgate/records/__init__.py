"""What rowgate seals and signs, as types: the bottom layer.

Status (and its one combining rule), gate results, bundle manifests and file digests,
the subject and provenance a bundle records, signer identities, review / attestation /
merge records, canonical JSON and validation against the checked-in schemas.

Nothing here imports rowgate beyond `rowgate.errors`: evidence, signing, gates and the
decision all stand on these types, never the other way round. Import the module you
need (`rowgate.records.status`, …); `rowgate.cli.schemas` is the one place that knows them
all, to generate the schemas.
"""
