"""The one runner for subject steps: everything that runs or compiles a subject's code.

A subject is untrusted, and so is everything its code does when run or compiled. Each
such step runs in bubblewrap (`bwrap`, the sandbox CI systems and Flatpak use; no
namespace plumbing by hand here): its own user, pid, network, IPC and UTS namespaces
(nothing outlives the step; only loopback), system directories and toolchains
read-only, the subject read-only (or a private writable copy), a private /tmp and
$HOME, the GPU device nodes only when the step needs the GPU, an allowlisted
environment, and limits on wall time, memory, processes and file size. What it never
sees: keys and config, CI tokens, the evidence store and staging, the user's home,
other repositories. `sandbox = "off"` in a row (with a reason) is the one way out, and
its bundle says UNCONFINED.
"""

from rowgate.sandbox.env import allowed_env
from rowgate.sandbox.runner import (
    SOCKET_NAME,
    Limits,
    Result,
    SandboxError,
    SandboxUnavailable,
    Served,
    Step,
    check_available,
    describe,
    policy,
    run,
    serve,
    socket_dir,
    spawn,
    stop,
)

__all__ = ["SOCKET_NAME", "Limits", "Result", "SandboxError", "SandboxUnavailable", "Served", "Step",
           "allowed_env", "check_available", "describe", "policy", "run", "serve",
           "socket_dir", "spawn", "stop"]
