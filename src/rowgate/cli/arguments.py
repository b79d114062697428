"""The `rowgate` command line's arguments: every command, its options, its help and
its exit codes. `rowgate.cli.main` parses with it and runs the commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

from rowgate import __version__
from rowgate.errors import ExitCode

DESCRIPTION = """rowgate: gates, signed evidence bundles, reviews and local merges for GPU
decode-kernel work.

Exit codes (rowgate.errors.ExitCode): 0 ok/PASS, 1 FAIL/ERROR/invalid,
2 usage or configuration error, 3 nothing failed but something is PENDING,
4 the filesystem refused a write (no space…); nothing was half-written (docs/security.md).
Each command's help lists what its codes mean (`rowgate COMMAND --help`).
"""

EXIT_CODES = {
    "gate": "0 every gate PASS · 1 a gate FAIL or ERROR · 3 nothing failed but something "
            "PENDING · 2 usage or configuration · 4 a write refused (no space…)",
    "verify": "0 valid · 1 invalid (one line naming the first problem) · 2 usage",
    "inspect": "0 shown · 1 unreadable bundle · 2 usage",
    "rows": "0 listed / valid · 2 invalid row file or usage",
    "schemas": "0 written / match · 1 drift (--check)",
    "build": "0 PASS · 1 FAIL or ERROR · 3 PENDING · 2 usage · 4 a write refused (no space…)",
    "review": "0 APPROVE · 1 REJECT · 3 PENDING · 2 usage (incl. reviewer = bundle signer) "
              "· 4 a write refused (no space…)",
    "attest-operator": "0 signed · 1 refused or unreadable · 2 usage · 4 a write refused (no space…)",
    "merge": "0 merged or already merged · 1 refused · 2 usage · 4 a write refused (no space…)",
    "report": "0 rendered (whatever the verdict) · 1 unreadable bundle · 2 usage "
              "· 4 a write refused (no space…)",
    "oracle": "0 recorded / valid / served until interrupted · 1 the engine failed or the "
              "record is invalid · 2 usage "
              "· 4 a write refused (no space…)",
    "compare": "0 no regression · 1 a regression (a candidate metric significantly slower, "
               "a gate gone worse) or a bundle does not verify · 3 inconclusive (nothing "
               "worse, but not told apart) · 2 usage, or not comparable (row, device, workload)",
    "toolchain": "0 fetched or listed · 1 the download or unpacking failed · 2 usage, or "
                 "this machine cannot fetch it (not Debian 12, no apt)",
    "history": "0 listed (whatever the verdicts) · 1 a bundle unreadable · 2 usage "
               "(no such row under the evidence dir)",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # `rowgate: error: oracle verify: …`, never `rowgate: error: rowgate oracle verify: …`
        where = self.prog.removeprefix("rowgate").strip()
        fatal(f"{where}: {message}" if where else message)


def fatal(message: str) -> NoReturn:
    print(f"rowgate: error: {message}", file=sys.stderr)
    sys.exit(int(ExitCode.USAGE))


ROWS_HELP = ("directory a row id is looked up in (default: $ROWGATE_ROWS, else ./rows; "
             "the built-in demos last)")


def _command(sub: Any, name: str, help_: str, codes: str | None = None,
             **kw: Any) -> argparse.ArgumentParser:
    """A subcommand whose help ends with its exit codes and which accepts `-q` after it."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_,
                       epilog=f"exit codes: {codes or EXIT_CODES[name]}", **kw)
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress output")
    return p


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rowgate", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rowgate {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="re-raise errors with tracebacks")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = _command(sub, "gate", "run a row's gates here, seal and sign a bundle")
    g.add_argument("row", help="row id (looked up as --rows says) or path to a row TOML")
    g.add_argument("--rows", type=Path, default=None,
                   help=ROWS_HELP)
    g.add_argument("--repo", type=Path, default=Path.cwd(),
                   help="subject: a git checkout or a directory inside one (default: .)")
    g.add_argument("--out", type=Path, default=None,
                   help="evidence dir (default: $XDG_STATE_HOME/rowgate/evidence, never the "
                        "subject)")
    g.add_argument("--base", default=None, help="base commit (default: merge-base with main)")
    _add_options_arg(g, "operator setting passed to gates (e.g. nvcc=/path/to/nvcc); keys "
                        "the row's gates do not read are refused")
    g.add_argument("--plan", action="store_true",
                   help="resolve what the row needs and print what would run where and what "
                        "would be PENDING, without running anything (exit 0 all would run, "
                        "3 something PENDING, 1 something would ERROR)")
    g.add_argument("--plan-gpu", action="append", default=[], metavar="ARCH[:NAME]",
                   help="with --plan: plan for this GPU instead of this host's (repeatable), "
                        "e.g. 'sm_110:NVIDIA Thor'")
    _add_json_arg(g, "print the sealed bundle as `inspect --json` does, instead of the table")

    v = _command(sub, "verify", "verify a sealed bundle byte for byte")
    v.add_argument("bundle", type=Path)
    _add_verifier_args(v)
    _add_json_arg(v, "print the outcome as JSON (also when invalid)")

    i = _command(sub, "inspect", "show a bundle's row, subject, signer and gates")
    i.add_argument("bundle", type=Path)
    _add_json_arg(i, "machine-readable output")

    r = _command(sub, "rows", "list rows and which gates can run here")
    r.add_argument("--rows", type=Path, default=None,
                   help=ROWS_HELP)
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
    mg.add_argument("--rows", type=Path, default=None,
                   help=ROWS_HELP)
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

    cp = _command(sub, "compare", "what changed between two bundles of one row (A before, "
                                  "B after), with statistics from the raw samples")
    cp.add_argument("bundle_a", type=Path, metavar="BUNDLE_A")
    cp.add_argument("bundle_b", type=Path, metavar="BUNDLE_B")
    cp.add_argument("--key", type=Path, action="append", default=None,
                    help="public key PEM of the signer: once for both bundles, or twice (A's "
                         "then B's); this or --identity/--issuer is required")
    cp.add_argument("--identity", help="signer's identity (keyless, both bundles)")
    cp.add_argument("--issuer", help="signer's OIDC issuer (keyless)")
    _add_json_arg(cp, "print the comparison as JSON")

    h = _command(sub, "history", "every bundle of a row by time and commit: verdicts and "
                                 "one metric over time")
    h.add_argument("row", help="row id (or a row TOML, for its id)")
    h.add_argument("--evidence", type=Path, default=None,
                   help="evidence dir (default: gate's: $XDG_STATE_HOME/rowgate/evidence)")
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
    orr.add_argument("row", help="row id (looked up as --rows says) or path to a row TOML")
    orr.add_argument("--rows", type=Path, default=None,
                     help="directory a row id is looked up in (default: $ROWGATE_ROWS, else ./rows)")
    orr.add_argument("--out", type=Path, default=None,
                     help="records dir (default: oracle-records/ in the current directory)")
    orr.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    _add_options_arg(orr, "engine setting (e.g. vllm_max_num_seqs=8)")
    ors = _command(orc_sub, "serve", "keep the row's pinned vLLM oracle loaded on this "
                                     "machine for runs to attach to (--option standing=1), "
                                     "until interrupted", EXIT_CODES["oracle"])
    ors.add_argument("row", help="row id (looked up as --rows says) or path to a row TOML")
    ors.add_argument("--rows", type=Path, default=None,
                     help="directory a row id is looked up in (default: $ROWGATE_ROWS, else ./rows)")
    ors.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    _add_options_arg(ors, "engine setting, as the runs will give it (e.g. vllm_max_num_seqs=8)")
    orv = _command(orc_sub, "verify", "verify an oracle record and summarise it",
                   EXIT_CODES["oracle"])
    orv.add_argument("record", type=Path)
    _add_verifier_args(orv)

    tc = _command(sub, "toolchain", "CUDA toolchains: list what builds each arch here, "
                                    "fetch the sm_70 nvcc", EXIT_CODES["toolchain"])
    tc_sub = tc.add_subparsers(dest="toolchain_command", required=True, parser_class=_Parser)
    tcl = _command(tc_sub, "list", "each arch's toolchain here, with every tool's version",
                   EXIT_CODES["toolchain"])
    _add_options_arg(tcl, "toolchain setting (nvcc=PATH, nvcc_sm70=PATH)")
    tcf = _command(tc_sub, "fetch", "fetch Debian 12's CUDA 11.8 toolkit (sm_70 nvcc) into "
                                    "rowgate's data dir", EXIT_CODES["toolchain"])
    tcf.add_argument("name", choices=["cuda-11.8"], help="the toolkit (cuda-11.8)")
    tcf.add_argument("--force", action="store_true", help="fetch again even if it is here")

    s = _command(sub, "schemas", "write the JSON Schemas of the sealed records from the models")
    s.add_argument("--out", type=Path, help="directory to write them to")
    s.add_argument("--check", action="store_true",
                   help="exit 1 if the schemas this rowgate ships drift from its models")
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


def check_verifier_args(ns: argparse.Namespace) -> None:
    if bool(getattr(ns, "identity", None)) != bool(getattr(ns, "issuer", None)):
        fatal("--identity and --issuer must be given together")
    if getattr(ns, "key", None) and getattr(ns, "identity", None):
        fatal("--key and --identity/--issuer are alternatives: give one")
