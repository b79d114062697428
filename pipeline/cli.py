"""`rowgate` command line: parses arguments, calls the core, renders, maps exit codes.

Exit codes (pipeline.errors.ExitCode): 0 ok/PASS, 1 FAIL/ERROR/invalid,
2 usage or configuration error, 3 nothing failed but something is PENDING.
Each command's help lists what its codes mean (`rowgate COMMAND --help`).
"""

from __future__ import annotations

import argparse
import json
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

EXIT_CODES = {
    "gate": "0 every gate PASS · 1 a gate FAIL or ERROR · 3 nothing failed but something "
            "PENDING · 2 usage or configuration",
    "verify": "0 valid · 1 invalid (one line naming the first problem) · 2 usage",
    "inspect": "0 shown · 1 unreadable bundle · 2 usage",
    "rows": "0 listed / valid · 2 invalid row file or usage",
    "schemas": "0 written / match · 1 drift (--check)",
    "build": "0 PASS · 1 FAIL or ERROR · 3 PENDING · 2 usage",
    "review": "0 APPROVE · 1 REJECT · 3 PENDING · 2 usage (incl. reviewer = bundle signer)",
    "attest-operator": "0 signed · 1 refused or unreadable · 2 usage",
    "merge": "0 merged or already merged · 1 refused · 2 usage",
    "report": "0 rendered (whatever the verdict) · 1 unreadable bundle · 2 usage",
    "oracle": "0 recorded / valid · 1 the engine failed or the record is invalid · 2 usage",
    "history": "0 listed (whatever the verdicts) · 1 a bundle unreadable · 2 usage "
               "(no such row under the evidence dir)",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # `rowgate: error: oracle verify: …`, never `rowgate: error: rowgate oracle verify: …`
        where = self.prog.removeprefix("rowgate").strip()
        _fatal(f"{where}: {message}" if where else message)


def _fatal(message: str) -> NoReturn:
    print(f"rowgate: error: {message}", file=sys.stderr)
    sys.exit(int(ExitCode.USAGE))


def _command(sub, name: str, help_: str, codes: str | None = None, **kw) -> argparse.ArgumentParser:
    """A subcommand whose help ends with its exit codes and which accepts `-q` after it."""
    p = sub.add_parser(name, help=help_, description=help_,
                       epilog=f"exit codes: {codes or EXIT_CODES[name]}", **kw)
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress output")
    return p


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rowgate", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rowgate {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="re-raise errors with tracebacks")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = _command(sub, "gate", "run a row's gates here, seal and sign a bundle")
    g.add_argument("row", help="row id (rows/ID.toml) or path to a row TOML")
    g.add_argument("--repo", type=Path, default=Path.cwd(), help="subject repository (default: .)")
    g.add_argument("--out", type=Path, default=None,
                   help="evidence dir (default: evidence/ in the current directory)")
    g.add_argument("--base", default=None, help="base commit (default: merge-base with main)")
    _add_options_arg(g, "operator setting passed to gates (e.g. nvcc=/path/to/nvcc); keys "
                        "the row's gates do not read are refused")
    _add_json_arg(g, "print the sealed bundle as `inspect --json` does, instead of the table")

    v = _command(sub, "verify", "verify a sealed bundle byte for byte")
    v.add_argument("bundle", type=Path)
    _add_verifier_args(v)
    _add_json_arg(v, "print the outcome as JSON (also when invalid)")

    i = _command(sub, "inspect", "show a bundle's row, subject, signer and gates")
    i.add_argument("bundle", type=Path)
    _add_json_arg(i, "machine-readable output")

    r = _command(sub, "rows", "list rows and which gates can run here")
    r_sub = r.add_subparsers(dest="rows_command", parser_class=_Parser)
    rc = _command(r_sub, "check", "validate one row file", EXIT_CODES["rows"])
    rc.add_argument("file", type=Path)

    rv = _command(sub, "review", "review a sealed bundle: APPROVE, REJECT or PENDING, signed")
    rv.add_argument("bundle", type=Path)
    rv.add_argument("--repo", type=Path, default=Path.cwd(), help="reviewer's clone (default: .)")
    rv.add_argument("--row", type=Path, default=None,
                    help="row file (default: the path the bundle records)")
    rv.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")
    _add_verifier_args(rv)
    _add_json_arg(rv, "print the review record (and its path) as JSON")

    at = _command(sub, "attest-operator",
                  "operator's signed statement on a reviewed bundle's hardware")
    at.add_argument("review", type=Path, help="REVIEWS/ROW/BUNDLE-ID.review.json")
    at.add_argument("--note", default="", help="free text recorded in the attestation")

    mg = _command(sub, "merge", "local git merge --no-ff of an approved head (never a push)")
    mg.add_argument("--row", required=True, help="row id or path to a row TOML")
    mg.add_argument("--repo", type=Path, default=Path.cwd(), help="repository (default: .)")
    mg.add_argument("--into", default=None, help="target branch (default: the row's merge_into)")
    mg.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")

    rp = _command(sub, "report", "one page for a bundle: HTML (self-contained) / Markdown")
    rp.add_argument("bundle", type=Path)
    rp.add_argument("--html", type=Path, metavar="OUT", help="write the HTML page here")
    rp.add_argument("--markdown", type=Path, metavar="OUT", help="write the Markdown here "
                    "(without --html/--markdown it goes to stdout)")
    rp.add_argument("--reviews", type=Path, default=None,
                    help="reviews dir (default: reviews/ in the current directory)")
    _add_verifier_args(rp)

    h = _command(sub, "history", "every bundle of a row by time and commit: verdicts and "
                                 "one metric over time")
    h.add_argument("row", help="row id (or a row TOML, for its id)")
    h.add_argument("--evidence", type=Path, default=None,
                   help="evidence dir (default: evidence/ in the current directory)")
    h.add_argument("--metric", default=None, metavar="GATE.METRIC",
                   help="a metric to follow: gate-level, or per cell where the gate has cells")
    h.add_argument("--plot", type=Path, default=None, metavar="OUT.png",
                   help="write the metric over time as a PNG")
    h.add_argument("--reviews", type=Path, default=None,
                   help="reviews dir (default: reviews/ in the current directory)")
    _add_verifier_args(h, optional=True)
    out = h.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the history as JSON")
    out.add_argument("--csv", action="store_true", help="print the history as CSV")

    bd = _command(sub, "build", "build kernels/ for an arch (warnings as errors), audit "
                                "budgets and SASS, print each kernel's resources")
    bd.add_argument("--arch", action="append", required=True, metavar="sm_XX",
                    help="arch to build (repeatable): sm_70, sm_90, sm_90a, sm_110, …")
    bd.add_argument("--kernel", action="append", default=[], help="kernel name (default: all)")
    bd.add_argument("--repo", type=Path, default=Path.cwd(), help="repository (default: .)")
    bd.add_argument("--aot", action="store_true", help="also probe Triton AOT reachability")
    _add_options_arg(bd, "toolchain setting (nvcc=/path/to/nvcc)")

    orc = _command(sub, "oracle", "signed records of the pinned oracle's outputs")
    orc_sub = orc.add_subparsers(dest="oracle_command", required=True, parser_class=_Parser)
    orr = _command(orc_sub, "record", "run the row's pinned oracle once on its workload "
                                      "and keep its outputs as a signed record",
                   EXIT_CODES["oracle"])
    orr.add_argument("row", help="row id (rows/ID.toml) or path to a row TOML")
    orr.add_argument("--out", type=Path, default=None,
                     help="records dir (default: oracle-records/ in the current directory)")
    orr.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    _add_options_arg(orr, "engine setting (e.g. vllm_max_num_seqs=8)")
    orv = _command(orc_sub, "verify", "verify an oracle record and summarise it",
                   EXIT_CODES["oracle"])
    orv.add_argument("record", type=Path)
    _add_verifier_args(orv)

    s = _command(sub, "schemas", "write schemas/*.schema.json from the models")
    s.add_argument("--check", action="store_true", help="exit 1 if the checked-in schemas drift")
    return p


def _add_options_arg(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help=help_)


def _add_json_arg(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--json", action="store_true", help=help_)


def _add_verifier_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    need = "" if optional else " (this or --identity/--issuer is required)"
    p.add_argument("--key", type=Path, help=f"public key PEM of the signer (key-signed){need}")
    p.add_argument("--identity", help="signer's identity (keyless)")
    p.add_argument("--issuer", help="signer's OIDC issuer (keyless)")


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
               "merge": _merge, "report": _report, "oracle": _oracle,
               "history": _history}[ns.command]
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


def _explicit_verifier(ns: argparse.Namespace, what: str, signature: Path):
    """verify and review check against a signer the user names: a default key would make
    "not by the expected key" the answer for every bundle someone else signed."""
    from pipeline import signing

    if ns.key is None and not (ns.identity or ns.issuer):
        own = signing.local_public_key()
        hint = f"; your own key's public half is {own}" if own.exists() else ""
        raise UsageError(f"{what}: pass --key PUB.pem of the signer (or --identity and --issuer "
                         f"for a keyless signature){hint}")
    return signing.verifier_for(ns.key, ns.identity, ns.issuer, signature)


def _gate(ns: argparse.Namespace) -> ExitCode:
    from pipeline import options, progress, report, rows, runner, signing

    loaded = rows.resolve_row(ns.row)
    opts = _options(ns.option)
    options.check_row(opts, loaded.row)
    signer = signing.default_signer()
    out = ns.out or Path.cwd() / "evidence"
    with progress.progress(len(loaded.row.gates), f"row {loaded.row.id}", ns.quiet) as prog:
        run = runner.run_row(loaded, ns.repo.resolve(), out.resolve(), signer, prog,
                             base=ns.base, options=opts)
    if ns.json:
        from pipeline.evidence import Bundle

        print(report.inspect_json(Bundle.open(run.bundle)))
        return STATUS_EXIT[run.status]
    informational = [g.id for g in loaded.row.gates if not g.required]
    report.console().print(report.gate_table(run.results, f"{loaded.row.id}: {run.status.value}",
                                             informational))
    print(run.bundle)
    return STATUS_EXIT[run.status]


def _build(ns: argparse.Namespace) -> ExitCode:
    import re

    from pipeline import options, progress, report
    from pipeline.build import local
    from pipeline.rowspec import ARCH_PATTERN

    for arch in ns.arch:
        if arch == "cpu" or not re.fullmatch(ARCH_PATTERN, arch):
            raise UsageError(f"--arch {arch!r}: expected sm_NN (e.g. sm_70, sm_90a, sm_110)")
    opts = _options(ns.option)
    options.check(opts, {o.key: o for o in options.TOOLCHAIN}, "rowgate build")
    with progress.progress(None, f"build {'+'.join(ns.arch)}", ns.quiet) as prog:
        result = local.local_build(ns.repo.resolve(), ns.arch, ns.kernel, opts, prog, aot=ns.aot)
    console = report.console()
    console.print(report.resource_table(result))
    for name, derived in (("build", result.build), ("audit", result.audit)):
        console.print(f"{name}: {derived.status.value}: {derived.reason}", markup=False)
    console.print(f"artifacts: {result.out}", markup=False)
    return STATUS_EXIT[result.status]


def _verify(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, signing
    from pipeline.errors import VerificationError
    from pipeline.evidence import Bundle

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
    from pipeline import report
    from pipeline.evidence import Bundle

    bundle = Bundle.open(ns.bundle)
    if ns.json:
        print(report.inspect_json(bundle))
    else:
        report.print_inspect(bundle, report.console())
    return ExitCode.OK


def _report(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report

    page = report.report_for(ns.bundle, key=ns.key, identity=ns.identity, issuer=ns.issuer,
                             reviews_dir=ns.reviews)
    written, markdown = report.publish(page, html_out=ns.html, markdown_out=ns.markdown)
    if ns.html is None and ns.markdown is None:
        print(markdown, end="")
    for path in written if not ns.quiet else ():
        print(f"rowgate: wrote {path}", file=sys.stderr)
    return ExitCode.OK


def _history(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, signing

    verifier = None  # without one, each bundle's signature is listed as not checked
    if ns.key is not None:
        verifier = signing.KeyVerifier(ns.key)
    elif ns.identity:
        verifier = signing.SigstoreVerifier(ns.identity, ns.issuer)
    found = report.history.collect(ns.row, ns.evidence or Path.cwd() / "evidence",
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
    return ExitCode.FAILED if found.unreadable else ExitCode.OK


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
    return (ns.reviews or Path.cwd() / "reviews").absolute()


def _review(ns: argparse.Namespace) -> ExitCode:
    from pipeline import report, signing
    from pipeline.decision import review

    verifier = _explicit_verifier(ns, "review", ns.bundle / signing.SIGNATURE_FILE)
    result = review.review(ns.bundle, ns.repo.resolve(), ns.row, verifier,
                           signing.default_signer(), _reviews_dir(ns))
    if ns.json:
        print(json.dumps({"path": str(result.path),
                          "record": result.record.model_dump(mode="json")}, indent=2))
    else:
        report.console().print(report.review_view(result.record))
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

    result = merge.merge(rows.resolve_row(ns.row), ns.repo.resolve(), ns.into, _reviews_dir(ns),
                         signing.default_signer())
    code = MERGE_EXIT[result.record.outcome]
    print(result.record.message, file=sys.stderr if code else sys.stdout)
    print(result.path)
    return code


def _oracle(ns: argparse.Namespace) -> ExitCode:
    from pipeline import options, oracle, rows, runner, signing

    if ns.oracle_command == "record":
        loaded = rows.resolve_row(ns.row)
        opts = _options(ns.option)
        options.check(opts, {o.key: o for o in options.ENGINE}, "the oracle's engine")
        say = (lambda _m: None) if ns.quiet else (lambda m: print(f"rowgate: {m}", file=sys.stderr))
        record = runner.record_oracle(loaded, signing.default_signer(),
                                      out_dir=ns.out or Path.cwd() / oracle.DEFAULT_DIR,
                                      device=ns.device, options=opts, say=say)
    else:
        verifier = _explicit_verifier(ns, "oracle verify", ns.record / signing.SIGNATURE_FILE)
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
