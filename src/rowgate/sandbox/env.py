"""The environment a subject step gets: an allowlist, never rowgate's own.

Secrets reach a process through its environment (`ROWGATE_SIGNING_KEY`, a runner's
`ACTIONS_ID_TOKEN_REQUEST_TOKEN`/`_URL`, `GITHUB_TOKEN`, cloud credentials): a denylist
misses the next one, so only the names below pass, and a step adds only what rowgate
chose for it (a cache dir inside its scratch, the row's declared variables).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PASSED = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "CUDA_VISIBLE_DEVICES",
          "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OMP_NUM_THREADS",
          "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
"""Taken from rowgate's environment when set: locale, the GPUs the operator chose, the
math libraries' CPU settings this machine needs."""
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
NEVER = ("ROWGATE_", "ACTIONS_", "GITHUB_", "AWS_", "GOOGLE_", "AZURE_", "SIGSTORE_")
"""Prefixes no step gets, even when a row or rowgate names them: a row is the operator's,
but a typo there must not hand a subject the signing key or an OIDC token."""


def allowed_env(extra: Mapping[str, str], path_dirs: tuple[str, ...] = ()) -> dict[str, str]:
    """The step's environment: PATH (`path_dirs` first, then the system's), HOME and
    TMPDIR inside the private /tmp, the passed names, then `extra` (refused if it names
    a secret's prefix)."""
    bad = sorted(k for k in extra if k.startswith(NEVER))
    if bad:
        raise ValueError(f"environment {bad[0]!r}: a subject step never gets {NEVER} variables")
    env = {k: os.environ[k] for k in PASSED if k in os.environ}
    env.update(PATH=os.pathsep.join(dict.fromkeys((*path_dirs, *SYSTEM_PATH))),
               HOME="/tmp/home", TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env
