"""`rowgate` command line: parses arguments, calls the core, renders, maps exit codes.

Exit codes (rowgate.errors.ExitCode): 0 ok/PASS, 1 FAIL/ERROR/invalid,
2 usage or configuration error, 3 nothing failed but something is PENDING,
4 the filesystem refused a write (no space…); nothing was half-written (docs/security.md).
Each command's help lists what its codes mean (`rowgate COMMAND --help`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rowgate.cli.arguments import EXIT_CODES, check_verifier_args, parser
from rowgate.errors import Error, ExitCode, UsageError
from rowgate.records.merge import MergeOutcome
from rowgate.records.review import Verdict
from rowgate.records.status import Status

if TYPE_CHECKING:
    from rowgate.rows.row import LoadedRow
    from rowgate.seal.signing import Verifier

logger = logging.getLogger("rowgate")

STATUS_EXIT = {Status.PASS: ExitCode.OK, Status.FAIL: ExitCode.FAILED,
               Status.ERROR: ExitCode.FAILED, Status.PENDING: ExitCode.PENDING}
VERDICT_EXIT = {Verdict.APPROVE: ExitCode.OK, Verdict.REJECT: ExitCode.FAILED,
                Verdict.PENDING: ExitCode.PENDING}
COMPARE_EXIT = {"no regression": ExitCode.OK, "regression": ExitCode.FAILED,
                "inconclusive": ExitCode.PENDING}
MERGE_EXIT = {MergeOutcome.MERGED: ExitCode.OK, MergeOutcome.ALREADY_MERGED: ExitCode.OK,
              MergeOutcome.REFUSED: ExitCode.FAILED}

__all__ = ["EXIT_CODES", "main"]


def _parser() -> argparse.ArgumentParser:
    """The argument parser (rowgate.cli.arguments), for tests and docs checks."""
    return parser()


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(format="%(message)s", level=logging.INFO)
    ns = _parser().parse_args(args)
    check_verifier_args(ns)
    handler = {"build": _build, "gate": _gate, "verify": _verify, "inspect": _inspect, "rows": _rows,
               "schemas": _schemas, "review": _review, "attest-operator": _attest_operator,
               "merge": _merge, "report": _report, "oracle": _oracle,
               "history": _history, "compare": _compare, "toolchain": _toolchain}[ns.command]
    try:
        code = handler(ns)
    except Error as exc:
        exc.log_and_exit(logger, raise_error=ns.verbose)
    except KeyboardInterrupt:
        print("rowgate: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(int(code))


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _explicit_verifier(ns: argparse.Namespace, what: str, signature: Path) -> Verifier:
    """verify and review check against a signer the user names: a default key would make
    "not by the expected key" the answer for every bundle someone else signed."""
    from rowgate.seal import signing

    if ns.key is None and not (ns.identity or ns.issuer):
        own = signing.local_public_key()
        hint = f"; your own key's public half is {own}" if own.exists() else ""
        raise UsageError(f"{what}: pass --key PUB.pem of the signer (or --identity and --issuer "
                         f"for a keyless signature){hint}")
    return signing.verifier_for(ns.key, ns.identity, ns.issuer, signature)


def _gate(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report, storage
    from rowgate.cli import progress
    from rowgate.rows import options
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import signing

    out = storage.out_dir(ns.out or storage.default_evidence(), "--out")
    loaded = rows.resolve_row(ns.row, ns.rows)
    opts = _options(ns.option)
    options.check_row(opts, loaded.row)
    if ns.plan or ns.plan_gpu:
        return _plan(ns, loaded, opts)
    signer = signing.default_signer()
    with progress.progress(len(loaded.row.gates), f"row {loaded.row.id}", ns.quiet) as prog:
        run = runner.run_row(loaded, ns.repo.resolve(), out, signer, prog,
                             base=ns.base, options=opts)
    if ns.json:
        from rowgate.seal.bundle import Bundle

        print(report.inspect_json(Bundle.open(run.bundle)))
        return STATUS_EXIT[run.status]
    informational = [g.id for g in loaded.row.gates if not g.required]
    report.console().print(report.gate_table(run.results, f"{loaded.row.id}: {run.status.value}",
                                             informational))
    print(run.bundle)
    return STATUS_EXIT[run.status]


def _plan(ns: argparse.Namespace, loaded: LoadedRow, opts: dict[str, str]) -> ExitCode:
    """The plan on stdout; a gate it finds would ERROR (a problem that is not missing
    hardware) is a configuration error: one line each on stderr, exit 2."""
    from rowgate import storage
    from rowgate.run import plan
    from rowgate.seal import device

    devices = plan.stand_in_gpus(ns.plan_gpu) if ns.plan_gpu else device.inventory()
    result = plan.plan_row(loaded, ns.repo.resolve(), devices, opts,
                           evidence=ns.out or storage.default_evidence())
    print("\n".join(plan.render(result)))
    for g in result.gates:
        if g.status == plan.ERROR:
            print(f"rowgate: {loaded.row.id} gate {g.gate_id}: {g.errors[0]}", file=sys.stderr)
    return {plan.RUNS: ExitCode.OK, plan.PENDING: ExitCode.PENDING}.get(result.status,
                                                                      ExitCode.USAGE)


def _build(ns: argparse.Namespace) -> ExitCode:
    import re

    from rowgate import report
    from rowgate.cli import progress
    from rowgate.rows import options
    from rowgate.rows.spec import ARCH_PATTERN
    from rowgate.run import local_build as local

    for arch in ns.arch:
        if arch == "cpu" or not re.fullmatch(ARCH_PATTERN, arch):
            raise UsageError(f"--arch {arch!r}: expected sm_NN (e.g. sm_70, sm_90a, sm_110)")
    opts = _options(ns.option)
    options.check(opts, options.TOOLCHAIN_KEYS, "rowgate build")
    with progress.progress(None, f"build {'+'.join(ns.arch)}", ns.quiet) as prog:
        result = local.local_build(ns.repo.resolve(), ns.arch, ns.kernel, opts, prog, aot=ns.aot)
    console = report.console()
    console.print(report.resource_table(result))
    for name, derived in (("build", result.build), ("audit", result.audit)):
        console.print(f"{name}: {derived.status.value}: {derived.reason}", markup=False)
    console.print(f"artifacts: {result.out}", markup=False)
    return STATUS_EXIT[result.status]


def _verify(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.errors import VerificationError
    from rowgate.seal import signing
    from rowgate.seal.bundle import Bundle

    bundle = Bundle.open(ns.bundle)
    verifier = _explicit_verifier(ns, "verify", bundle.path / signing.SIGNATURE_FILE)
    try:
        identity = bundle.verify(verifier)
    except VerificationError as exc:
        if ns.json:
            print(json.dumps(report.verify_doc(bundle, problem=exc.diagnostics()), indent=2))
        raise
    if ns.json:
        print(json.dumps(report.verify_doc(bundle, identity=identity), indent=2))
    else:
        print(f"OK {bundle.path}: row {bundle.manifest.row.id}, commit "
              f"{bundle.manifest.subject.commit[:12]}, {len(bundle.manifest.files)} files, "
              f"signed by {identity}")
    return ExitCode.OK


def _inspect(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.seal.bundle import Bundle

    bundle = Bundle.open(ns.bundle)
    if ns.json:
        print(report.inspect_json(bundle))
    else:
        report.print_inspect(bundle, report.console())
    return ExitCode.OK


def _report(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report, storage

    for flag, path in (("--html", ns.html), ("--markdown", ns.markdown)):
        if path is not None:
            storage.output_file(path, flag)
    page = report.report_for(ns.bundle, key=ns.key, identity=ns.identity, issuer=ns.issuer,
                             reviews_dir=ns.reviews)
    written, markdown = report.publish(page, html_out=ns.html, markdown_out=ns.markdown)
    if ns.html is None and ns.markdown is None:
        print(markdown, end="")
    for path in written if not ns.quiet else ():
        print(f"rowgate: wrote {path}", file=sys.stderr)
    return ExitCode.OK


def _history(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report, storage
    from rowgate.seal import signing

    verifier: signing.Verifier | None = None  # without one: signatures listed as not checked
    if ns.key is not None:
        verifier = signing.KeyVerifier(ns.key)
    elif ns.identity:
        verifier = signing.SigstoreVerifier(ns.identity, ns.issuer)
    found = report.history.collect(ns.row, ns.evidence or storage.default_evidence(),
                                   metric=ns.metric, verifier=verifier,
                                   reviews_dir=ns.reviews or Path.cwd() / "reviews")
    if ns.plot is not None:
        report.history.plot(found, ns.plot)
        if not ns.quiet:
            print(f"rowgate: wrote {ns.plot}", file=sys.stderr)
    if ns.json:
        print(json.dumps(found.doc(), indent=2))
    elif ns.csv:
        print(found.csv(), end="")
    else:
        report.console().print(report.history_table(found))
        for note in found.notes:  # where a metric was read under its other format's name
            print(f"note: {note}")
    return ExitCode.FAILED if found.unreadable else ExitCode.OK


def _compare(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.report import compare
    from rowgate.seal import signing

    va: Verifier
    vb: Verifier
    if ns.identity:
        va = vb = signing.SigstoreVerifier(ns.identity, ns.issuer)
    elif ns.key and len(ns.key) <= 2:
        va, vb = signing.KeyVerifier(ns.key[0]), signing.KeyVerifier(ns.key[-1])
    else:
        raise UsageError("compare: pass --key PUB.pem (once for both bundles, or A's then "
                         "B's) or --identity and --issuer")
    result = compare.compare(ns.bundle_a, ns.bundle_b, va, vb)
    if ns.json:
        print(json.dumps(result.doc(), indent=2))
    else:
        report.console().print(report.compare_view(result))
    return COMPARE_EXIT[result.outcome]


def _rows(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.rows import row as rows

    if ns.rows_command == "check":
        loaded = rows.load_row(ns.file)
        print(f"{ns.file}: ok ({loaded.row.id}, {len(loaded.row.gates)} gates, "
              f"{len(loaded.row.criteria)} criteria)")
        return ExitCode.OK
    report.console().print(report.rows_table(rows.all_rows(ns.rows)))
    return ExitCode.OK


def _reviews_dir(ns: argparse.Namespace) -> Path:
    from rowgate import storage

    return storage.out_dir(ns.reviews or Path.cwd() / "reviews", "--reviews")


def _review(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.decision import review
    from rowgate.seal import signing

    reviews = _reviews_dir(ns)
    verifier = _explicit_verifier(ns, "review", ns.bundle / signing.SIGNATURE_FILE)
    result = review.review(ns.bundle, ns.repo.resolve(), ns.row, verifier,
                           signing.default_signer(), reviews)
    if ns.json:
        print(json.dumps({"path": str(result.path),
                          "record": result.record.model_dump(mode="json")}, indent=2))
    else:
        report.console().print(report.review_view(result.record))
        print(result.path)
    return VERDICT_EXIT[result.record.verdict]


def _attest_operator(ns: argparse.Namespace) -> ExitCode:
    from rowgate.decision import attest
    from rowgate.seal import signing

    path = attest.attest(ns.review, signing.default_signer(), ns.note)
    print(f"operator attestation for {ns.review.name} signed")
    print(path)
    return ExitCode.OK


def _merge(ns: argparse.Namespace) -> ExitCode:
    from rowgate.decision import merge
    from rowgate.rows import row as rows
    from rowgate.seal import signing

    reviews = _reviews_dir(ns)
    result = merge.merge(rows.resolve_row(ns.row, ns.rows), ns.repo.resolve(), ns.into, reviews,
                         signing.default_signer())
    code = MERGE_EXIT[result.record.outcome]
    print(result.record.message, file=sys.stderr if code else sys.stdout)
    print(result.path)
    return code


def _oracle(ns: argparse.Namespace) -> ExitCode:
    from rowgate import storage
    from rowgate.rows import options
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import oracle, signing

    if ns.oracle_command == "serve":
        from rowgate.run.standing import serve_oracle

        opts = _options(ns.option)
        options.check(opts, options.engine_keys(), "the oracle's engine")
        code = serve_oracle(rows.resolve_row(ns.row, ns.rows), device=ns.device, options=opts,
                            say=lambda m: print(f"rowgate: {m}", file=sys.stderr, flush=True))
        return ExitCode.OK if code == 0 else ExitCode.FAILED
    if ns.oracle_command == "record":
        out = storage.out_dir(ns.out or Path.cwd() / oracle.DEFAULT_DIR, "--out")
        loaded = rows.resolve_row(ns.row, ns.rows)
        opts = _options(ns.option)
        options.check(opts, options.engine_keys(), "the oracle's engine")
        say = (lambda _m: None) if ns.quiet else (lambda m: print(f"rowgate: {m}", file=sys.stderr))
        record = runner.record_oracle(loaded, signing.default_signer(), out_dir=out,
                                      device=ns.device, options=opts, say=say)
    else:
        verifier = _explicit_verifier(ns, "oracle verify", ns.record / signing.SIGNATURE_FILE)
        record = oracle.load_record(ns.record, verifier)
    print(f"{record.path}\n  row {record.row_id}, {record.engine.get('engine')} "
          f"{record.version}, {len(record.outputs)} requests, model {record.model_digest}, "
          f"workload {record.workload_digest}, signed by {record.signer}")
    return ExitCode.OK


def _toolchain(ns: argparse.Namespace) -> ExitCode:
    from rowgate import report
    from rowgate.cli import progress
    from rowgate.cuda import debian_toolkit, toolchains
    from rowgate.rows import options

    if ns.toolchain_command == "fetch":
        quiet = getattr(ns, "quiet", False)
        with progress.progress(len(debian_toolkit.PACKAGES) + 3, f"fetch {ns.name}",
                               quiet) as prog:
            def say(message: str) -> None:
                prog.update(message)
                prog.advance()
            nvcc = debian_toolkit.fetch(say, force=ns.force)
        print(nvcc)
        return ExitCode.OK
    opts = _options(ns.option)
    options.check(opts, options.TOOLCHAIN_KEYS, "rowgate toolchain list")
    report.console().print(report.toolchain_table(toolchains.by_arch(opts)))
    return ExitCode.OK


def _schemas(ns: argparse.Namespace) -> ExitCode:
    from rowgate.cli import schemas

    if ns.check:
        drift = schemas.drift()
        if drift:
            print(f"schemas drift from the models: {', '.join(drift)} (run nox -s schemas)")
            return ExitCode.FAILED
        print("schemas match the models")
        return ExitCode.OK
    if ns.out is None:
        raise UsageError("schemas: name --out DIR (a checkout's src/rowgate/schemas) or --check; "
                         "an installed rowgate is never written into")
    for path in schemas.write_all(ns.out):
        print(path)
    return ExitCode.OK


if __name__ == "__main__":  # pragma: no cover
    main()
