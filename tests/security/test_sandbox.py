"""A hostile subject's code cannot change a verdict: each of its steps runs in the sandbox.

A real subject repository whose host command is its own `check.sh` (as real rows run
`make check`) tries each attack against the real `rowgate gate` with a real signing key,
a planted CI token and a real evidence dir; a kernel source tries to `#include` a secret.
Every attack fails, and the gate still seals an honest, verifying bundle.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

import rowgate
from rowgate.seal import signing
from tests.review_support import make_key
from tests.security._support import make_subject, proc_env
from tests.security._support import rowgate as rowgate_cli
from tests.support import write_row

TOKEN = "planted-oidc-token-6f1e"
SECRET = "outside-the-subject-9c2a"
MARKER = f"313.{os.getpid():07d}"
"""A daemon's `sleep` argument no other process has (not even another test run's)."""

CHECK = textwrap.dedent(f'''\
    #!/bin/sh
    # every attack of a hostile pull request; each line says what it got
    echo "key-env: ${{ROWGATE_SIGNING_KEY:-none}}"
    cat "$ROWGATE_SIGNING_KEY" 2>&1 | head -c 200
    cat "$1"/config/rowgate/signing-key.pem 2>&1 | head -c 200
    echo "token: ${{ACTIONS_ID_TOKEN_REQUEST_TOKEN:-none}} ${{ACTIONS_ID_TOKEN_REQUEST_URL:-none}}"
    find "$1/evidence" -type f 2>&1 | head -5
    for f in $(find "$1/evidence" -type f 2>/dev/null); do echo FORGED >> "$f"; done
    echo FORGED >> "$2" 2>&1 || echo "package: refused"
    setsid sleep {MARKER} > /dev/null 2>&1 < /dev/null &
    cat "$1/outside/secret.txt" 2>&1
    echo done
''')


@pytest.fixture
def hostile(tmp_path):
    """The subject with check.sh, a key, a token, an evidence dir and a secret outside."""
    subject = make_subject(tmp_path / "subject", files={"check.sh": CHECK}, toml=None)
    os.chmod(subject / "check.sh", 0o755)
    subprocess.run(["git", "-C", str(subject), "update-index", "--chmod=+x", "check.sh"],
                   check=True)
    subprocess.run(["git", "-C", str(subject), "commit", "-qm", "exec\n\nSigned-off-by: T <t@e>"],
                   check=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET + "\n")
    package = Path(rowgate.__file__)
    row = write_row(tmp_path / "rows", "TEST-HOSTILE", textwrap.dedent(f'''
        [[gates]]
        id = "first"
        kind = "host"
        require_clean = false
        commands = [["./check.sh", "{tmp_path}", "{package}"]]
    '''))
    key = make_key(tmp_path / "operator-key.pem")
    return subject, row, key, package


def _gate(tmp_path: Path, subject: Path, row: Path, key: Path) -> tuple[subprocess.CompletedProcess, Path]:
    env = proc_env(ROWGATE_SIGNING_KEY=str(key), ACTIONS_ID_TOKEN_REQUEST_TOKEN=TOKEN,
                   ACTIONS_ID_TOKEN_REQUEST_URL=f"https://ci.example/{TOKEN}",
                   XDG_CONFIG_HOME=str(tmp_path / "config"))
    run = rowgate_cli("gate", row, "--repo", subject, "--out", tmp_path / "evidence", env=env)
    assert run.code == 0, (run.out, run.err)
    return run, Path(run.last)


def test_a_hostile_subject_gets_none_of_the_seven_attacks(tmp_path, hostile):
    subject, row, key, package = hostile
    package_bytes = package.read_bytes()
    # an earlier bundle in the same evidence dir: the staging's neighbours
    _, earlier = _gate(tmp_path, subject, row, key)
    _, bundle = _gate(tmp_path, subject, row, key)
    log = (bundle / "artifacts" / "first" / "command-0.log").read_text()
    key_text = key.read_text()
    assert "key-env: none" in log and key_text[30:80] not in log                 # 1 key
    assert TOKEN not in log and "token: none none" in log                        # 2 token
    assert "FORGED" not in "".join(p.read_text(errors="replace")               # 3 stage
                                   for b in (earlier, bundle) for p in b.rglob("*.json"))
    assert package.read_bytes() == package_bytes and "package: refused" in log   # 4 code
    assert MARKER not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                        text=True).stdout                       # 5 daemon
    assert SECRET not in log and "No such file" in log                           # 6 outside
    pub = tmp_path / "operator.pub.pem"
    pub.write_bytes(signing.KeySigner(key).public_pem)
    assert rowgate_cli("verify", bundle, "--key", pub).code == 0  # sealed honestly
    result = json.loads((bundle / "gates" / "first.json").read_text())
    assert result["status"] == "PASS" and result["sandbox"]["mode"] == "bubblewrap"
    assert result["sandbox"]["tool"] == "bubblewrap" and len(result["sandbox"]["profile_sha256"]) == 64


def test_an_include_of_a_secret_is_not_compiled_in(tmp_path):                   # 7 include
    secret = tmp_path / "outside" / "secret.h"
    secret.parent.mkdir()
    secret.write_text(f'#error "{SECRET}"\n')
    source = f'#include "{secret}"\nextern "C" __global__ void scale(float* x) {{ x[0] *= 2.f; }}\n'
    subject = make_subject(tmp_path / "subject", files={"kernels/clean.cu": source,
                                                        "kernels/include/.keep": ""},
                           toml='''
        version = 1
        [kernels.k]
        source = "clean.cu"
        entry_points = ["scale"]
        arches = ["sm_90"]
    ''')
    run = rowgate_cli("build", "--arch", "sm_90", "--repo", subject)
    assert run.code == 1, (run.out, run.err)
    said = run.out + run.err
    assert "secret.h" in said and SECRET not in said
    for log in Path(os.environ["ROWGATE_CACHE_DIR"]).rglob("nvcc.log"):
        assert SECRET not in log.read_text(errors="replace")


def test_each_limit_is_named_when_a_step_hits_it(tmp_path):
    from rowgate import sandbox

    slow = sandbox.run(sandbox.Step(["sleep", "30"], cwd=tmp_path,
                                    limits=sandbox.Limits(wall_s=0.5)))
    assert (slow.returncode, slow.limit) == (124, "wall time 0.5 s") and slow.duration_s < 10
    big = sandbox.run(sandbox.Step(["sh", "-c", "head -c 4096 /dev/zero > /tmp/f"], cwd=tmp_path,
                                   limits=sandbox.Limits(file_bytes=1024)))
    assert big.limit == "file size 1024 bytes"
    gone = sandbox.run(sandbox.Step(["no-such-tool"], cwd=tmp_path))
    assert gone.returncode == 127


def test_a_subject_step_sees_no_network_but_loopback(tmp_path):
    from rowgate import sandbox

    done = sandbox.run(sandbox.Step(["cat", "/proc/net/dev"], cwd=tmp_path))
    interfaces = [line.split(":")[0].strip() for line in done.stdout.decode().splitlines()[2:]]
    assert interfaces == ["lo"]


def test_turning_the_sandbox_off_needs_a_reason_and_marks_the_bundle(tmp_path, capsys):
    from rowgate.errors import RowError
    from rowgate.rows.row import load_row

    body = '''
        [[gates]]
        id = "host"
        kind = "host"
        require_clean = false
        commands = [["true"]]

        [sandbox]
        mode = "off"
    '''
    bare = write_row(tmp_path / "a", "TEST-OFF", textwrap.dedent(body))
    with pytest.raises(RowError, match="sandbox.reason: turning the sandbox off needs a "
                                       "written reason"):
        load_row(bare)
    row = write_row(tmp_path / "b", "TEST-OFF", textwrap.dedent(body) +
                    'reason = "the runner has no user namespaces"\n')
    subject = make_subject(tmp_path / "subject", toml=None)
    run = rowgate_cli("gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    result = json.loads((Path(run.last) / "gates" / "host.json").read_text())
    assert result["sandbox"] == {"mode": "off", "tool": "", "version": "", "profile_sha256": "",
                                 "reason": "the runner has no user namespaces"}
    shown = rowgate_cli("inspect", run.last)
    assert "UNCONFINED" in shown.out
    page = tmp_path / "report.md"
    assert rowgate_cli("report", run.last, "--markdown", page).code == 0
    assert "UNCONFINED: host (sandbox off: the runner has no user namespaces)" in page.read_text()


def test_a_host_without_bubblewrap_is_one_configuration_line(tmp_path):
    subject = make_subject(tmp_path / "subject", toml=None)
    row = write_row(tmp_path / "rows", "TEST-NOBWRAP", textwrap.dedent('''
        [[gates]]
        id = "host"
        kind = "host"
        commands = [["true"]]
    '''))
    empty = tmp_path / "bin"
    empty.mkdir()
    os.symlink("/usr/bin/git", empty / "git")
    run = rowgate_cli("gate", row, "--repo", subject, "--out", tmp_path / "evidence",
                      env=proc_env(PATH=str(empty)))
    assert run.code == 2 and "Traceback" not in run.err
    assert run.err.strip().splitlines() == [
        'sandbox: bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: apt-get '
        'install bubblewrap), or turn the sandbox off in the row with a reason ([sandbox] '
        'mode = "off")']
    assert not (tmp_path / "evidence").exists() or not list((tmp_path / "evidence").rglob("*.json"))


SERVER = textwrap.dedent(f'''\
    import http.server, json, os, socket, socketserver, subprocess, sys
    print("key-env:", os.environ.get("ROWGATE_SIGNING_KEY", "none"), flush=True)
    print("token:", os.environ.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "none"), flush=True)
    try:
        print(open(sys.argv[2]).read(), flush=True)
    except OSError as exc:
        print("outside:", exc.strerror, flush=True)
    try:  # the host's loopback, where rowgate's own listener waits
        socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=2).close()
        print("network: reached the host", flush=True)
    except OSError as exc:
        print("network:", exc.strerror, flush=True)
    subprocess.Popen(["setsid", "sleep", "{MARKER}"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({{"data": [{{"id": "subject-model"}}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self):
            return "client"

    class OnSocket(http.server.HTTPServer):
        address_family = socket.AF_UNIX

        def server_bind(self):
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = "localhost", 0

    if sys.argv[1].isdigit():
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
    OnSocket(sys.argv[1], Models).serve_forever()
''')


@pytest.mark.parametrize("listen", ["{port}", "{socket}"])
def test_a_subject_server_is_reached_only_through_one_socket_and_gets_no_attack(
        tmp_path, monkeypatch, listen):
    from rowgate.engines.openai import OpenAIEngine
    from rowgate.models.tiny import TinyModelSpec, build_tiny_model
    from rowgate.sandbox.bridge import UnixHTTPConnection

    tiny_model_dir = build_tiny_model(TinyModelSpec(), root=tmp_path / "models").path
    subject = tmp_path / "subject"
    subject.mkdir()
    (subject / "serve.py").write_text(SERVER)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    key = make_key(tmp_path / "operator-key.pem")
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(key))
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", TOKEN)
    host = socket.create_server(("127.0.0.1", 0))  # reachable from the host only
    engine = OpenAIEngine(["python", "serve.py", listen, str(tmp_path / "outside/secret.txt"),
                           str(host.getsockname()[1])], tiny_model_dir, subject=subject)
    with host, engine:
        assert engine.served_model == "subject-model"  # reached through the one socket
        assert engine.describe()["sandbox"] == "bubblewrap"
        # rowgate's client speaks on the socket itself; the host's port forwards to it
        assert isinstance(engine._connection(5), UnixHTTPConnection)
        conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=5)
        conn.request("GET", "/v1/models")
        assert b"subject-model" in conn.getresponse().read()
        conn.close()
        relays = [a for a in subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True,
                                            text=True).stdout.splitlines()
                  if "rowgate.sandbox.bridge" in a and str(engine.port) in a]
        assert bool(relays) == (listen == "{port}")  # a server on its own socket: no relay
        socket_dir = engine._socket.parent if engine._socket else None
    said = engine.log.read_text()
    assert "key-env: none" in said and "token: none" in said and TOKEN not in said
    assert SECRET not in said and "outside: No such file or directory" in said
    assert "network: Connection refused" in said  # its loopback is not the host's
    assert MARKER not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                        text=True).stdout
    assert socket_dir is None or not socket_dir.exists()  # the socket goes with the server


@pytest.mark.parametrize("allowed", [False, True])
def test_review_rejects_an_unconfined_bundle_unless_the_row_allows_it(tmp_path, allowed):
    body = textwrap.dedent(f'''
        [[gates]]
        id = "host"
        kind = "host"
        commands = [["true"]]

        [sandbox]
        mode = "off"
        reason = "the runner has no user namespaces"

        [review]
        require_operator_attestation = false
        allow_unconfined = {str(allowed).lower()}
    ''')
    row = write_row(tmp_path / "rows", "TEST-OFF", body)
    subject = make_subject(tmp_path / "subject", toml=None)
    gate_key, review_key = make_key(tmp_path / "gate.pem"), make_key(tmp_path / "review.pem")
    run = rowgate_cli("gate", row, "--repo", subject, "--out", tmp_path / "evidence",
                      env=proc_env(ROWGATE_SIGNING_KEY=str(gate_key)))
    assert run.code == 0, run.err
    pub = tmp_path / "gate.pub.pem"
    pub.write_bytes(signing.KeySigner(gate_key).public_pem)
    review = rowgate_cli("review", run.last, "--key", pub, "--repo", subject, "--row", row,
                         "--reviews", tmp_path / "reviews",
                         env=proc_env(ROWGATE_SIGNING_KEY=str(review_key)))
    said = review.out + review.err
    assert (review.code, "ran unconfined" in said) == ((0, False) if allowed else (1, True)), said
