// Verify a rowgate signature (a Sigstore bundle v0.3: DSSE envelope over an in-toto
// Statement, signed with an ECDSA P-256 key) with sigstore-js (@sigstore/verify), then
// print each file the signed statement names as a JSON line [name, sha256], for the
// caller to hold against the files on disk (what a third-party verifier does with a
// model-signing statement). Usage: node sigstore_js_verify.js SIGNATURE PUB.pem
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

const [signaturePath, publicKeyPath] = process.argv.slice(2);
const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(signaturePath, 'utf8')));
const pem = fs.readFileSync(publicKeyPath, 'utf8');
const hint = bundle.verificationMaterial.content.publicKey.hint;
const emptyRoot = { mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
  tlogs: [], ctlogs: [], certificateAuthorities: [], timestampAuthorities: [] };
const keys = { [hint]: { rawBytes: crypto.createPublicKey(pem).export({ type: 'spki', format: 'der' }),
  keyDetails: 'PKIX_ECDSA_P256_SHA_256', validFor: { start: new Date(0) } } };
// A key-signed bundle has no transparency-log entry and no timestamp: none are required.
const verifier = new Verifier(toTrustMaterial(emptyRoot, keys),
  { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
verifier.verify(toSignedEntity(bundle));
const statement = JSON.parse(Buffer.from(bundle.content.dsseEnvelope.payload).toString('utf8'));
for (const resource of statement.predicate.resources) {
  console.log(JSON.stringify([resource.name, resource.digest]));
}
