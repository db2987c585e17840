"""Static checks: findings read from a submission's source with `ast`, never importing or running it.

Runs in the parent, on the extracted source (and the reference's, for the checks that compare with it).

A finding names something a reviewer or a rule should look at (a side stream, a patched timer, a cache keyed by
tensor identity, a reduced-precision path). It is evidence, not a verdict: `analyze` returns one `Finding` per
flag that fires, with the lines that made it fire.

Layout: source.py indexes the parsed source once (names, strings, matching helpers); each family module holds the
checks of one kind and exposes them as `CHECKS` (finding name -> check): system.py (what the code reaches beyond
its forward: packages, processes, threads, network, native code, environment, files, exits, RNG state),
tampering.py (introspection, the import machinery, monkeypatching, obfuscation, identity-keyed state), compute.py
(precision, streams and libraries, from Python names and from C++/CUDA strings), model.py (exception fallbacks,
the reference Model, ModelNew's constructor) and kernels.py (the submission's own kernels, for the backends whose
kernels are module functions). Together they detect exactly the static findings of the catalogue
(harness/shared/findings.py).

Backends. The submission's backend (harness/shared/backends: the config's, or detected from the source) decides what
applies: the packages it imports are not `imports_beyond_torch` (triton under Triton), and the checks a backend
lists in its `source_checks` run only under it.

Method
- Names. Each `import` / `from ... import` binds a local name to a dotted name (`import torch.nn.functional as F`
  binds F to torch.nn.functional), and `x = <attribute chain>` rooted at such a name adds an alias. A chain such
  as `t.cuda.Event.elapsed_time` is resolved through its root to a full dotted name and matched against dotted
  names and prefixes (`subprocess` matches `subprocess.run`). A bare builtin (`open`, `eval`) resolves to
  `builtins.<name>` unless the module rebinds that name at top level.
- Strings. The C++/CUDA checks search every string constant (f-string parts included) with C comments removed.
  The Python checks look at code only, so a kernel source that says `fork` is not a process spawn.

Limits
- Scopes are not modelled: imports and aliases count module-wide, and names bound inside functions (a parameter
  called `open`) do not shadow builtins. Values are not followed (`m = load(); m.attr = f`, a star import).
- Any static check can be defeated (`getattr(__import__("o" + "s"), name)`). The `obfuscation` flag catches the
  usual means of hiding a name, and the dynamic checks of the run stage back these flags up.
- A source that does not parse gives no findings; the syntax_error status covers it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from harness.integrity.static import compute, kernels, model, system, tampering
from harness.integrity.static.source import _evidence, _Module
from harness.shared import backends, findings
from harness.shared.backends.common import parse

logger = logging.getLogger(__name__)

# The static findings and their meanings (harness/shared/findings.py is the catalogue).
FLAGS: dict[str, str] = findings.STATIC


@dataclass(frozen=True)
class Finding:
    flag: str       # one of FLAGS
    evidence: str   # up to MAX_SHOWN occurrences as "line N: what", joined by "; ", then "(+N more)"


_FAMILIES = (system, tampering, compute, model, kernels)
# Every check, in catalogue order.
_CHECKS = {flag: family.CHECKS[flag] for flag in findings.STATIC for family in _FAMILIES if flag in family.CHECKS}


def analyze(source: str, reference_source: Optional[str] = None,
            reference_is_float32: bool = True, backend: str = "auto") -> list[Finding]:
    """One Finding per flag that fires, sorted by flag name; never raises on source that parses. `backend`: the
    config's (auto: detected from the source)."""
    tree = parse(source)
    if tree is None:
        return []
    reference = parse(reference_source) if reference_source is not None else None
    chosen = backends.select(backend, source)
    try:
        module = _Module(tree, reference, chosen)
    except Exception:  # a bug here must not take the evaluation down with it; the log keeps the traceback
        logger.warning("static checks could not index the source", exc_info=True)
        return []
    found = []
    for flag, check in _CHECKS.items():
        if flag == findings.PRECISION_DOWNGRADE and not reference_is_float32:
            continue
        if flag in backends.BACKEND_CHECKS and flag not in chosen.source_checks:
            continue
        try:
            hits = check(module)
        except Exception:  # as above: one failing check must not lose the others
            logger.warning("static check %s failed", flag, exc_info=True)
            continue
        if hits:
            found.append(Finding(flag, _evidence(hits)))
    return sorted(found, key=lambda finding: finding.flag)
