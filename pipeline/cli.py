"""`rowgate` command line: parses arguments, calls the core, maps exit codes.

Exit codes (pipeline.errors.ExitCode): 0 ok/PASS, 1 FAIL/ERROR/invalid,
2 usage or configuration error, 3 nothing failed but something is PENDING,
4 the filesystem refused a write (no space…); nothing was half-written. docs/security.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import NoReturn

from pipeline import __version__
from pipeline.errors import Error, ExitCode, UsageError
from pipeline.records.merge import MergeOutcome
from pipeline.records.review import Verdict
from pipeline.records.status import Status

logger = logging.getLogger("rowgate")

STATUS_EXIT = {Status.PASS: ExitCode.OK, Status.FAIL: ExitCode.FAILED,
               Status.ERROR: ExitCode.FAILED, Status.PENDING: ExitCode.PENDING}
VERDICT_EXIT = {Verdict.APPROVE: ExitCode.OK, Verdict.REJECT: ExitCode.FAILED,
                Verdict.PENDING: ExitCode.PENDING}
MERGE_EXIT = {MergeOutcome.MERGED: ExitCode.OK, MergeOutcome.ALREADY_MERGED: ExitCode.OK,
              MergeOutcome.REFUSED: ExitCode.FAILED}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fatal(f"{self.prog}: {message}")


def _fatal(message: str) -> NoReturn:
    print(f"rowgate: error: {message}", file=sys.stderr)
    sys.exit(int(ExitCode.USAGE))


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rowgate", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rowgate {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="re-raise errors with tracebacks")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("gate", help="run a row's gates here, seal and sign a bundle")
    g.add_argument("row", help="row id (rows/ID.toml) or path to a row TOML")
    g.add_argument("--repo", type=Path, default=Path.cwd(), help="subject repository (default: .)")
    g.add_argument("--out", type=Path, default=None,
                   help="evidence dir (default: $XDG_STATE_HOME/rowgate/evidence, never the subject)")
    g.add_argument("--base", default=None, help="base commit (default: merge-base with main)")
    g.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="operator setting passed to gates (e.g. nvcc=/path/to/nvcc)")
    g.add_argument("--plan", action="store_true",
                   help="resolve what the row needs and print what would run where and what "
                        "would be PENDING, without running anything (exit 0 all would run, "
                        "3 something PENDING, 1 something would ERROR)")
    g.add_argument("--plan-gpu", action="append", default=[], metavar="ARCH[:NAME]",
                   help="with --plan: plan for this GPU instead of this host's (repeatable), "
                        "e.g. 'sm_110:NVIDIA Thor'")

    v = sub.add_parser("verify", help="verify a sealed bundle byte for byte")
    v.add_argument("bundle", type=Path)
    _add_verifier_args(v)

    i = sub.add_parser("inspect", help="show a bundle's row, subject, signer and gates")
    i.add_argument("bundle", type=Path)
    i.add_argument("--json", action="store_true", help="machine-readable output")

    r = sub.add_parser("rows", help="list rows and which gates can run here")
    r_sub = r.add_subparsers(dest="rows_command", parser_class=_Parser)
    rc = r_sub.add_parser("check", help="validate one row file")
    rc.add_argument("file", type=Path)

    rv = sub.add_parser("review", help="review a sealed bundle: APPROVE, REJECT or PENDING, signed")
    rv.add_argument("bundle", type=Path)
    rv.add_argument("--repo", type=Path, default=Path.cwd(), help="reviewer's clone (default: .)")
    rv.add_argument("--row", type=Path, default=None,
                    help="row file (default: the path the bundle records)")
    rv.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")
    _add_verifier_args(rv)

    at = sub.add_parser("attest-operator",
                        help="operator's signed statement on a reviewed bundle's hardware")
    at.add_argument("review", type=Path, help="REVIEWS/ROW/BUNDLE-ID.review.json")
    at.add_argument("--note", default="", help="free text recorded in the attestation")

    mg = sub.add_parser("merge", help="local git merge --no-ff of an approved head (never a push)")
    mg.add_argument("--row", required=True, help="row id or path to a row TOML")
    mg.add_argument("--repo", type=Path, default=Path.cwd(), help="repository (default: .)")
    mg.add_argument("--into", default=None, help="target branch (default: the row's merge_into)")
    mg.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")

    rp = sub.add_parser("report", help="one page for a bundle: HTML (self-contained) / Markdown")
    rp.add_argument("bundle", type=Path)
    rp.add_argument("--html", type=Path, metavar="OUT", help="write the HTML page here")
    rp.add_argument("--markdown", type=Path, metavar="OUT", help="write the Markdown here "
                    "(without --html/--markdown it goes to stdout)")
    rp.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")
    _add_verifier_args(rp)

    bd = sub.add_parser("build", help="build kernels/ for an arch (warnings as errors), audit "
                                      "budgets and SASS, print each kernel's resources")
    bd.add_argument("--arch", action="append", required=True, metavar="sm_XX",
                    help="arch to build (repeatable): sm_70, sm_90, sm_90a, sm_110, …")
    bd.add_argument("--kernel", action="append", default=[], help="kernel name (default: all)")
    bd.add_argument("--repo", type=Path, default=Path.cwd(), help="repository (default: .)")
    bd.add_argument("--aot", action="store_true", help="also probe Triton AOT reachability")
    bd.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="toolchain setting (e.g. nvcc=/path/to/nvcc)")

    orc = sub.add_parser("oracle", help="signed records of the pinned oracle's outputs")
    orc_sub = orc.add_subparsers(dest="oracle_command", required=True, parser_class=_Parser)
    orr = orc_sub.add_parser("record", help="run the row's pinned oracle once on its workload "
                                            "and keep its outputs as a signed record")
    orr.add_argument("row", help="row id (rows/ID.toml) or path to a row TOML")
    orr.add_argument("--out", type=Path, default=None,
                     help="records dir (default: oracle-records/ in the current directory)")
    orr.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    orr.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="engine setting (e.g. vllm_max_num_seqs=8)")
    orv = orc_sub.add_parser("verify", help="verify an oracle record and summarise it")
    orv.add_argument("record", type=Path)
    _add_verifier_args(orv)

    s = sub.add_parser("schemas", help="write schemas/*.schema.json from the models")
    s.add_argument("--check", action="store_true", help="exit 1 if the checked-in schemas drift")
    for sp in sub.choices.values():  # `-q` also after the subcommand (`rowgate gate ROW -q`)
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress output")
    return p


def _add_verifier_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", type=Path, help="public key PEM of the bundle's signer (key-signed)")
    p.add_argument("--identity", help="bundle signer's identity (keyless bundles)")
    p.add_argument("--issuer", help="bundle signer's OIDC issuer (keyless bundles)")


def _check_verifier_args(ns: argparse.Namespace) -> None:
    if bool(getattr(ns, "identity", None)) != bool(getattr(ns, "issuer", None)):
        _fatal("--identity and --issuer must be given together")
    if getattr(ns, "key", None) and getattr(ns, "identity", None):
        _fatal("--key and --identity/--issuer are alternatives: give one")


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(format="%(message)s", level=logging.INFO)
    ns = _parser().parse_args(args)
    _check_verifier_args(ns)
    handler = {"build": _build, "gate": _gate, "verify": _verify, "inspect": _inspect, "rows": _rows,
               "schemas": _schemas, "review": _review, "attest-operator": _attest_operator,
               "merge": _merge, "report": _report, "oracle": _oracle}[ns.command]
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


def _gate(ns: argparse.Namespace) -> ExitCode:
    from pipeline import progress, report, rows, runner, signing, storage

    out = storage.out_dir(ns.out or storage.default_evidence(), "--out")
    loaded = rows.resolve_row(ns.row)
    if ns.plan or ns.plan_gpu:
        return _plan(ns, loaded)
    signer = signing.default_signer()
    with progress.progress(len(loaded.row.gates), f"row {loaded.row.id}", ns.quiet) as prog:
        run = runner.run_row(loaded, ns.repo.resolve(), out, signer, prog,
                             base=ns.base, options=_options(ns.option))
    console = report.console()
    console.print(report.gate_table(run.results, f"{loaded.row.id}: {run.status.value}"))
    print(run.bundle)
    return STATUS_EXIT[run.status]


def _plan(ns: argparse.Namespace, loaded) -> ExitCode:
    from pipeline import device, plan

    devices = plan.stand_in_gpus(ns.plan_gpu) if ns.plan_gpu else device.inventory()
    result = plan.plan_row(loaded, ns.repo.resolve(), devices)
    print("\n".join(plan.render(result)))
    return {plan.RUNS: ExitCode.OK, plan.PENDING: ExitCode.PENDING}.get(result.status,
                                                                      ExitCode.FAILED)


def _build(ns: argparse.Namespace) -> ExitCode:
    import re

    from pipeline import progress, report
    from pipeline.build import local
    from pipeline.rowspec import ARCH_PATTERN

    for arch in ns.arch:
        if arch == "cpu" or not re.fullmatch(ARCH_PATTERN, arch):
            raise UsageError(f"--arch {arch!r}: expected sm_NN (e.g. sm_70, sm_90a, sm_110)")
    with progress.progress(None, f"build {'+'.join(ns.arch)}", ns.quiet) as prog:
        result = local.local_build(ns.repo.resolve(), ns.arch, ns.kernel, _options(ns.option),
                                   prog, aot=ns.aot)
    console = report.console()
    console.print(report.resource_table(result))
    for name, derived in (("build", result.build), ("audit", result.audit)):
        console.print(f"{name}: {derived.status.value}: {derived.reason}", markup=False)
    console.print(f"artifacts: {result.out}", markup=False)
    return STATUS_EXIT[result.status]


def _verify(ns: argparse.Namespace) -> ExitCode:
    from pipeline import signing
    from pipeline.evidence import Bundle

    bundle = Bundle.open(ns.bundle)
    identity = bundle.verify(signing.verifier_for(ns.key, ns.identity, ns.issuer,
                                                  bundle.path / signing.SIGNATURE_FILE))
    print(f"OK {bundle.path}: row {bundle.manifest.row.id}, commit "
          f"{bundle.manifest.subject.commit[:12]}, {len(bundle.manifest.files)} files, "
          f"signed by {identity}")
    return ExitCode.OK


def _inspect(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report
    from pipeline.evidence import Bundle

    bundle = Bundle.open(ns.bundle)
    if ns.json:
        print(report.inspect_json(bundle))
    else:
        report.print_inspect(bundle, report.console())
    return ExitCode.OK


def _report(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, storage

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


def _rows(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, rows

    if ns.rows_command == "check":
        loaded = rows.load_row(ns.file)
        print(f"{ns.file}: ok ({loaded.row.id}, {len(loaded.row.gates)} gates, "
              f"{len(loaded.row.criteria)} criteria)")
        return ExitCode.OK
    report.console().print(report.rows_table(rows.all_rows()))
    return ExitCode.OK


def _reviews_dir(ns: argparse.Namespace) -> Path:
    from pipeline import storage

    return storage.out_dir(ns.reviews or Path.cwd() / "reviews", "--reviews")


def _review(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, signing
    from pipeline.decision import review

    if ns.key is None and not (ns.identity or ns.issuer):
        raise UsageError("review: pass --key PUB.pem of the bundle's signer "
                         "(or --identity and --issuer for a keyless bundle)")
    reviews = _reviews_dir(ns)
    verifier = signing.verifier_for(ns.key, ns.identity, ns.issuer,
                                    ns.bundle / signing.SIGNATURE_FILE)
    result = review.review(ns.bundle, ns.repo.resolve(), ns.row, verifier,
                           signing.default_signer(), reviews)
    for line in report.describe_review(result.record):
        print(line)
    print(result.path)
    return VERDICT_EXIT[result.record.verdict]


def _attest_operator(ns: argparse.Namespace) -> ExitCode:
    from pipeline import signing
    from pipeline.decision import attest

    path = attest.attest(ns.review, signing.default_signer(), ns.note)
    print(f"operator attestation for {ns.review.name} signed")
    print(path)
    return ExitCode.OK


def _merge(ns: argparse.Namespace) -> ExitCode:
    from pipeline import rows, signing
    from pipeline.decision import merge

    reviews = _reviews_dir(ns)
    result = merge.merge(rows.resolve_row(ns.row), ns.repo.resolve(), ns.into, reviews,
                         signing.default_signer())
    code = MERGE_EXIT[result.record.outcome]
    print(result.record.message, file=sys.stderr if code else sys.stdout)
    print(result.path)
    return code


def _oracle(ns: argparse.Namespace) -> ExitCode:
    from pipeline import oracle, rows, runner, signing, storage

    if ns.oracle_command == "record":
        out = storage.out_dir(ns.out or Path.cwd() / oracle.DEFAULT_DIR, "--out")
        loaded = rows.resolve_row(ns.row)
        say = (lambda _m: None) if ns.quiet else (lambda m: print(f"rowgate: {m}", file=sys.stderr))
        record = runner.record_oracle(loaded, signing.default_signer(), out_dir=out,
                                      device=ns.device, options=_options(ns.option), say=say)
    else:
        verifier = signing.verifier_for(ns.key, ns.identity, ns.issuer,
                                        ns.record / signing.SIGNATURE_FILE)
        record = oracle.load_record(ns.record, verifier)
    print(f"{record.path}\n  row {record.row_id}, {record.engine.get('engine')} "
          f"{record.version}, {len(record.outputs)} requests, model {record.model_digest}, "
          f"workload {record.workload_digest}, signed by {record.signer}")
    return ExitCode.OK


def _schemas(ns: argparse.Namespace) -> ExitCode:
    from pipeline import schemas

    if ns.check:
        drift = schemas.drift()
        if drift:
            print(f"schemas drift from the models: {', '.join(drift)} (run nox -s schemas)")
            return ExitCode.FAILED
        print("schemas match the models")
        return ExitCode.OK
    for path in schemas.write_all():
        print(path)
    return ExitCode.OK


if __name__ == "__main__":  # pragma: no cover
    main()
