"""Static checks: flags raised by reading a submission's source with `ast` (never importing or running it).

A flag names something a reviewer or a rule should look at (a side stream, a patched timer, a cache keyed by
tensor identity, a reduced-precision path). It is evidence, not a verdict: `analyze` returns one `Finding` per
flag that fires, with the lines that made it fire.

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

import ast
import builtins
import logging
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

from harness.core import findings

logger = logging.getLogger(__name__)

# The static findings and their meanings (harness/core/findings.py is the catalogue).
FLAGS: dict[str, str] = findings.STATIC

MAX_SHOWN = 3  # occurrences quoted in a finding's evidence

_BUILTIN_NAMES = frozenset(dir(builtins)) | {"exit", "quit"}
_NN_MODULE = {"torch.nn.Module", "torch.nn.modules.module.Module", "torch.nn.modules.Module"}
_NN_MODULE_AS_WRITTEN = {"nn.Module", "torch.nn.Module", "Module"}  # when the import is not resolvable
_DYNAMIC_IMPORTS = {"builtins.__import__", "importlib.import_module", "importlib.__import__"}
_ATTR_BUILTINS = {"builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"}
_TRY_NODES = (ast.Try, ast.TryStar)


@dataclass(frozen=True)
class Finding:
    flag: str       # one of FLAGS
    evidence: str   # up to MAX_SHOWN occurrences as "line N: what", joined by "; ", then "(+N more)"


@dataclass(frozen=True)
class _Hit:
    line: Optional[int]  # None: the finding is about the file as a whole
    what: str


@dataclass(frozen=True)
class _Ref:
    """A maximal chain of names and attributes in the code, e.g. `torch.cuda.Stream` in `torch.cuda.Stream()`."""

    line: int
    name: Optional[str]  # dotted name with its root resolved; None when the root is a local value or unknown
    raw: str             # the chain as written
    node: ast.expr


@dataclass(frozen=True)
class _String:
    line: int
    end_line: int
    text: str
    code: str  # text with C comments blanked out (newlines kept, so line numbers still hold)

    def line_of(self, offset: int) -> int:
        return min(self.line + self.text.count("\n", 0, offset), self.end_line)


# --------------------------------------------------------------------------- public entry point


def analyze(source: str, reference_source: Optional[str] = None,
            reference_is_float32: bool = True) -> list[Finding]:
    """One Finding per flag that fires, sorted by flag name; never raises on source that parses."""
    tree = _parse(source)
    if tree is None:
        return []
    reference = _parse(reference_source) if reference_source is not None else None
    try:
        module = _Module(tree, reference)
    except Exception:  # a bug here must not take the evaluation down with it; the log keeps the traceback
        logger.warning("static checks could not index the source", exc_info=True)
        return []
    findings = []
    for flag, check in _CHECKS.items():
        if flag == "precision_downgrade" and not reference_is_float32:
            continue
        try:
            hits = check(module)
        except Exception:  # as above: one failing check must not lose the others
            logger.warning("static check %s failed", flag, exc_info=True)
            continue
        if hits:
            findings.append(Finding(flag, _evidence(hits)))
    return sorted(findings, key=lambda finding: finding.flag)


def _parse(source: str) -> Optional[ast.Module]:
    try:
        with warnings.catch_warnings():  # the candidate's invalid escape sequences are not our warnings
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _evidence(hits: list[_Hit]) -> str:
    unique = sorted(dict.fromkeys(hits), key=lambda hit: -1 if hit.line is None else hit.line)
    shown = "; ".join(hit.what if hit.line is None else f"line {hit.line}: {hit.what}" for hit in unique[:MAX_SHOWN])
    more = len(unique) - MAX_SHOWN
    return f"{shown} (+{more} more)" if more > 0 else shown


# --------------------------------------------------------------------------- the indexed source


class _Module:
    """What the checks need from one parsed source, computed once."""

    def __init__(self, tree: ast.Module, reference: Optional[ast.Module]):
        self.tree = tree
        self.reference = reference
        self.nodes = list(ast.walk(tree))
        self.parents = {child: node for node in self.nodes for child in ast.iter_child_nodes(node)}
        self.bindings = _import_bindings(self.nodes)
        _add_assigned_aliases(self.nodes, self.bindings)
        self.rebound = _module_level_names(tree) - set(self.bindings)  # top-level names that hide builtins
        self.refs = list(self._maximal_chains())
        self.imports = _static_imports(self.nodes) + list(self._literal_dynamic_imports())
        self.strings = [_string(node) for node in self.nodes
                        if isinstance(node, ast.Constant) and isinstance(node.value, str)]

    def resolve(self, node: ast.AST) -> Optional[str]:
        """`t.cuda.Stream` -> "torch.cuda.Stream" after `import torch as t`; None for local values."""
        parts = _chain(node)
        if parts is None:
            return None
        root = parts[0]
        if root in self.bindings:
            base = self.bindings[root]
        elif root in _BUILTIN_NAMES and root not in self.rebound:
            base = f"builtins.{root}"
        else:
            return None
        return ".".join([base, *parts[1:]])

    def is_imported_root(self, node: ast.AST) -> bool:
        parts = _chain(node)
        return parts is not None and parts[0] in self.bindings

    def calls(self) -> Iterator[tuple[ast.Call, Optional[str]]]:
        for node in self.nodes:
            if isinstance(node, ast.Call):
                yield node, self.resolve(node.func)

    def _maximal_chains(self) -> Iterator[_Ref]:
        for node in self.nodes:
            if not isinstance(node, (ast.Name, ast.Attribute)):
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # part of a longer chain
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                continue  # binding a bare name is not a use of what it was bound to
            parts = _chain(node)
            if parts is not None:
                yield _Ref(node.lineno, self.resolve(node), ".".join(parts), node)

    def _literal_dynamic_imports(self) -> Iterator[tuple[int, str]]:
        for call, name in self.calls():
            if name in _DYNAMIC_IMPORTS and call.args and _literal_str(call.args[0]) is not None:
                yield call.lineno, call.args[0].value


def _chain(node: ast.AST) -> Optional[list[str]]:
    """["torch", "cuda", "Stream"] for `torch.cuda.Stream`; None when the chain starts at anything but a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _from_name(node: ast.ImportFrom, name: str) -> str:
    base = "." * node.level + (node.module or "")
    return f"{base}.{name}" if node.module else base + name


def _import_bindings(nodes: list[ast.AST]) -> dict[str, str]:
    bindings = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bindings[alias.asname] = alias.name
                else:  # `import torch.nn.functional` binds only `torch`
                    root = alias.name.split(".")[0]
                    bindings[root] = root
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    bindings[alias.asname or alias.name] = _from_name(node, alias.name)
    return bindings


def _add_assigned_aliases(nodes: list[ast.AST], bindings: dict[str, str]) -> None:
    """`cuda = torch.cuda` makes `cuda` an alias of torch.cuda (repeated, so aliases of aliases resolve too)."""
    candidates = [(node.targets[0].id, _chain(node.value)) for node in nodes
                  if isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and isinstance(node.value, (ast.Name, ast.Attribute))]
    changed = True
    while changed:
        changed = False
        for name, parts in candidates:
            if name not in bindings and parts and parts[0] in bindings:
                bindings[name] = ".".join([bindings[parts[0]], *parts[1:]])
                changed = True


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names the module binds outside functions, classes and comprehensions (those shadow builtins)."""
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _static_imports(nodes: list[ast.AST]) -> list[tuple[int, str]]:
    """(line, dotted name) of everything an import statement names: "os.environ" for `from os import environ`."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, _from_name(node, alias.name)) for alias in node.names]
    return found


_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _string(node: ast.Constant) -> _String:
    line = getattr(node, "lineno", 1)
    end_line = getattr(node, "end_lineno", None) or line
    code = _C_COMMENT.sub(lambda match: "\n" * match.group(0).count("\n"), node.value)
    return _String(line, end_line, node.value, code)


def _literal_str(node: Optional[ast.AST]) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


# --------------------------------------------------------------------------- matching helpers


def _matches(name: Optional[str], patterns: Iterable[str]) -> bool:
    """Pattern `a.b` matches the names a.b and a.b.c; a pattern ending in `*` is a plain prefix (`os.exec*`)."""
    if name is None:
        return False
    for pattern in patterns:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern or name.startswith(pattern + "."):
            return True
    return False


def _shown(name: str) -> str:
    return name.removeprefix("builtins.")


def _named(module: _Module, patterns: Iterable[str], import_patterns: Iterable[str] = ()) -> list[_Hit]:
    """Imports and uses of the given dotted names; import_patterns apply to import statements only."""
    patterns, import_patterns = tuple(patterns), tuple(import_patterns)
    hits = [_Hit(line, f"import {name}") for line, name in module.imports
            if _matches(name, patterns) or _matches(name, import_patterns)]
    hits += [_Hit(ref.line, _shown(ref.name)) for ref in module.refs if _matches(ref.name, patterns)]
    return hits


def _in_strings(module: _Module, pattern: re.Pattern, keep: Callable[[re.Match], bool] = lambda m: True,
                raw: bool = False) -> list[_Hit]:
    """Matches of pattern in the string constants (C comments removed unless raw)."""
    hits = []
    for string in module.strings:
        for match in pattern.finditer(string.text if raw else string.code):
            if keep(match):
                found = match.group(0).rstrip("(").strip()  # "at::matmul (" -> "at::matmul"
                hits.append(_Hit(string.line_of(match.start()), f"{found} in a source string"))
    return hits


def _words(*alternatives: str) -> re.Pattern:
    return re.compile("|".join(alternatives))


def _attr_calls(module: _Module) -> Iterator[tuple[ast.Call, str, Optional[str]]]:
    """getattr/setattr/delattr/hasattr calls: (call, which builtin, literal attribute name or None)."""
    for call, name in module.calls():
        if name in _ATTR_BUILTINS:
            attr = _literal_str(call.args[1]) if len(call.args) >= 2 else None
            yield call, _shown(name), attr


def _assignment_targets(node: ast.AST) -> list[ast.expr]:
    """Targets an assignment or `del` writes, with tuple unpacking flattened."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    flat = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            flat.append(target)
    return flat


# --------------------------------------------------------------------------- checks on names


def _check_imports(module: _Module) -> list[_Hit]:
    hits = []
    for line, name in module.imports:
        top = name.split(".")[0]
        if top != "torch" and top not in sys.stdlib_module_names:
            hits.append(_Hit(line, name))
    return hits


def _names_check(*patterns: str) -> Callable[[_Module], list[_Hit]]:
    return lambda module: _named(module, patterns)


_PROCESS_NAMES = ("subprocess", "multiprocessing", "torch.multiprocessing", "pty",
                  "concurrent.futures.ProcessPoolExecutor", "os.fork", "os.forkpty", "os.system", "os.popen",
                  "os.spawn*", "os.exec*", "os.posix_spawn*")
_THREAD_NAMES = ("threading", "_thread", "concurrent.futures.ThreadPoolExecutor", "asyncio")
_NETWORK_NAMES = ("socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx", "ftplib", "smtplib",
                  "telnetlib", "xmlrpc", "websocket", "websockets", "aiohttp")
_NATIVE_NAMES = ("ctypes", "_ctypes", "cffi", "mmap", "torch.ops.load_library", "torch.classes.load_library")
_ENV_NAMES = ("os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv")
_SEED_NAMES = ("torch.manual_seed", "torch.seed", "torch.initial_seed", "torch.random", "torch.set_rng_state",
               "torch.get_rng_state", "torch.Generator", "torch.default_generator", "torch.cuda.manual_seed",
               "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all", "torch.cuda.initial_seed",
               "torch.cuda.random", "torch.cuda.set_rng_state", "torch.cuda.get_rng_state",
               "torch.cuda.set_rng_state_all", "torch.cuda.get_rng_state_all", "random.seed", "random.setstate",
               "numpy.random.seed", "numpy.random.default_rng", "numpy.random.RandomState")


def _check_introspection(module: _Module) -> list[_Hit]:
    frame_attrs = {"f_back", "f_locals", "f_globals", "f_code", "gi_frame", "tb_frame", "tb_next",
                   "__subclasses__", "__globals__", "__closure__", "__code__"}
    hits = _named(module, ("gc", "inspect", "sys._getframe", "sys._current_frames", "sys.settrace",
                           "sys.setprofile", "threading.settrace", "threading.setprofile", "builtins.globals"))
    hits += [_Hit(node.lineno, f".{node.attr}") for node in module.nodes
             if isinstance(node, ast.Attribute) and node.attr in frame_attrs]
    hits += [_Hit(call.lineno, f"{which}(..., {attr!r})") for call, which, attr in _attr_calls(module)
             if attr in frame_attrs]
    # vars() with no argument is locals(), which is harmless; vars(obj) exposes another namespace.
    hits += [_Hit(call.lineno, "vars(...)") for call, name in module.calls()
             if name == "builtins.vars" and (call.args or call.keywords)]
    return hits


def _check_sys_modules(module: _Module) -> list[_Hit]:
    hits = _named(module, ("sys.modules", "importlib.reload"), import_patterns=("builtins", "__builtin__"))
    for node in module.nodes:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name == "__builtins__":
            hits.append(_Hit(node.lineno, "__builtins__"))
        elif name == "__import__" and isinstance(node.ctx, ast.Store):
            hits.append(_Hit(node.lineno, "__import__ assigned"))
    return hits


def _check_exits(module: _Module) -> list[_Hit]:
    hits = _named(module, ("sys.exit", "os._exit", "os.abort", "os.kill", "os.killpg", "builtins.exit",
                           "builtins.quit", "signal"))
    for node in module.nodes:
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = module.resolve(raised)
            if name in ("builtins.SystemExit", "builtins.KeyboardInterrupt"):
                hits.append(_Hit(node.lineno, f"raise {_shown(name)}"))
    return hits


_FILE_NAMES = ("builtins.open", "io.open", "io.FileIO", "os.open", "os.write", "os.fdopen", "os.dup", "os.dup2",
               "os.pipe", "os.remove", "os.unlink", "os.rename", "os.renames", "os.replace", "os.mkdir",
               "os.makedirs", "os.rmdir", "os.removedirs", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.ftruncate", "shutil", "tempfile", "torch.save", "torch.load")
_PATH_METHODS = {"write_text", "write_bytes", "open", "unlink", "mkdir", "rename", "touch", "rmdir"}
_FD_PATHS = re.compile(r"/proc/self/fd|/dev/fd\b")


def _check_file_io(module: _Module) -> list[_Hit]:
    hits = _named(module, _FILE_NAMES)
    # pathlib-style methods, whatever they are called on (the receiver's type is not known statically)
    hits += [_Hit(call.lineno, f".{call.func.attr}()") for call, name in module.calls()
             if isinstance(call.func, ast.Attribute) and call.func.attr in _PATH_METHODS
             and not _matches(name, _FILE_NAMES)]
    hits += _in_strings(module, _FD_PATHS, raw=True)
    return hits


_DECODING_MODULES = ("base64", "binascii", "codecs", "marshal", "pickle", "zlib", "lzma", "bz2", "gzip")
_DECODING_NAME = re.compile(r"decode|decompress|unhexlify|a2b_|Unpickler|^loads?$")


def _check_obfuscation(module: _Module) -> list[_Hit]:
    hits = _named(module, ("builtins.eval", "builtins.exec", "builtins.compile", "builtins.__import__",
                           "importlib.import_module", "importlib.__import__", "types.CodeType",
                           "types.FunctionType", "types.LambdaType"))
    hits += [_Hit(call.lineno, f"{which} with a computed name") for call, which, attr in _attr_calls(module)
             if attr is None]
    hits += [_Hit(ref.line, ref.name) for ref in module.refs
             if _matches(ref.name, _DECODING_MODULES) and _DECODING_NAME.search(ref.name.rsplit(".", 1)[-1])]
    return hits


# --------------------------------------------------------------------------- monkeypatching


def _patched_name(module: _Module, target: ast.expr) -> Optional[str]:
    """The dotted name an assignment target patches, if it is rooted at an imported name."""
    subscripted = False
    while isinstance(target, ast.Subscript):  # torch.nn.functional.__dict__["relu"] = f
        target, subscripted = target.value, True
    if not (isinstance(target, ast.Attribute) or subscripted) or not module.is_imported_root(target):
        return None
    return module.resolve(target)


def _is_exempt_patch(name: str) -> bool:
    # torch.backends switches belong to precision_downgrade, os.environ writes to env_access
    return _matches(name, ("torch.backends", "os.environ"))


def _check_monkeypatch(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        for target in _assignment_targets(node):
            name = _patched_name(module, target)
            if name is not None and not _is_exempt_patch(name):
                verb = "deleted" if isinstance(node, ast.Delete) else "assigned"
                hits.append(_Hit(target.lineno, f"{name} {verb}"))
    for call, which, attr in _attr_calls(module):
        if which in ("setattr", "delattr") and call.args and module.is_imported_root(call.args[0]):
            name = f"{module.resolve(call.args[0])}.{attr or '<computed>'}"
            if not _is_exempt_patch(name):
                hits.append(_Hit(call.lineno, f"{which}({module.resolve(call.args[0])}, {attr!r})"))
    return hits


# --------------------------------------------------------------------------- precision, streams, libraries

_REDUCED_PRECISION_SWITCHES = {"allow_tf32", "allow_fp16_reduced_precision_reduction",
                               "allow_bf16_reduced_precision_reduction"}
_LOW_PRECISION_NAMES = ("torch.float16", "torch.half", "torch.bfloat16", "torch.autocast", "torch.amp",
                        "torch.cuda.amp", "torch.cpu.amp", "torch.set_autocast*", "torch.HalfTensor",
                        "torch.BFloat16Tensor", "torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor")
_LOW_PRECISION_SOURCE = _words(
    r"\b__half\w*", r"\bhalf2\b", r"\b__nv_bfloat16\w*", r"\bnv_bfloat16\w*", r"\b__float2half\w*",
    r"\b__float2bfloat16\w*", r"\b__bfloat162float\b", r"\bwmma::", r"\bmma\.sync", r"\bwgmma\b", r"\btf32\b",
    r"\b(?:at|c10)::(?:Half|BFloat16)\b", r"\bat::k(?:Half|BFloat16)\b", r"\btorch::k(?:Float16|Half|BFloat16)\b",
    r"\bCUBLAS_TF32\w*", r"\bCUBLAS_TENSOR_OP_MATH\b", r"\bCUBLAS_COMPUTE_(?:16F|32F_FAST_\w+)",
    r"\bCUDA_R_16BF?\b", r"\bcublasSetMathMode\b", r"\ballow_tf32\b", r"\bsetAllowTF32\w*")


def _keeps_full_precision(value: Optional[ast.expr]) -> bool:
    return isinstance(value, ast.Constant) and value.value is False


def _check_precision(module: _Module) -> list[_Hit]:
    hits = _named(module, _LOW_PRECISION_NAMES)
    for node in module.nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and not _keeps_full_precision(node.value):
            hits += [_Hit(t.lineno, f"{t.attr} = ...") for t in _assignment_targets(node)
                     if isinstance(t, ast.Attribute) and t.attr in _REDUCED_PRECISION_SWITCHES]
    for call, which, attr in _attr_calls(module):
        value = call.args[2] if len(call.args) >= 3 else None
        if which == "setattr" and attr in _REDUCED_PRECISION_SWITCHES and not _keeps_full_precision(value):
            hits.append(_Hit(call.lineno, f"setattr(..., {attr!r})"))
    for call, _ in module.calls():
        method = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if isinstance(call.func, ast.Attribute) and method in ("half", "bfloat16"):
            hits.append(_Hit(call.lineno, f".{method}()"))
        elif method == "set_float32_matmul_precision":
            keywords = [k.value for k in call.keywords if k.arg == "precision"]
            value = call.args[0] if call.args else keywords[0] if keywords else None
            if _literal_str(value) != "highest":
                hits.append(_Hit(call.lineno, "set_float32_matmul_precision(...) below 'highest'"))
    hits += _in_strings(module, _LOW_PRECISION_SOURCE)
    return hits


_STREAM_NAMES = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream",
                 "torch.cuda.StreamContext", "torch.cuda.streams.Stream", "torch.cuda.streams.ExternalStream",
                 "torch.Stream")
_STREAM_SOURCE = _words(
    r"\bcudaStreamCreate\w*", r"\bcudaStreamNonBlocking\b", r"\bgetStreamFromPool\b", r"\bcudaLaunchHostFunc\b",
    r"\bcudaStreamAddCallback\b", r"\bcudaStreamPerThread\b", r"default-stream[= ]per-thread",
    r"\bstd::thread\b(?!::)", r"\bstd::async\b", r"\bpthread_create\b")


def _check_side_stream(module: _Module) -> list[_Hit]:
    return _named(module, _STREAM_NAMES) + _in_strings(module, _STREAM_SOURCE)


_LIBRARY_SOURCE = _words(r"\bcublas\w*", r"\bcudnn\w*", r"\bcusparse\w*", r"\bcufft\w*", r"\bcurand\w*",
                         r"\bcutlass::", r"\bcute::", r"\bthrust::", r"\bcub::", r"\bat::native::\w+")
_ATEN_CALL = re.compile(r"\b(?:at|torch)::((?:\w+::)*)(\w+)\s*\(")
# at::/torch:: calls that allocate or describe tensors rather than compute with them.
_ATEN_HELPERS = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
                 "full_like", "from_blob", "Tensor", "IntArrayRef", "ArrayRef", "DimVector", "SmallVector",
                 "irange", "ScalarType", "Device", "DeviceGuard", "OptionalDeviceGuard", "TensorOptions",
                 "Scalar", "MemoryFormat", "make_tuple", "optional", "nullopt", "dtype", "device", "layout",
                 "requires_grad", "elementSize", "toString", "globalContext"}
_ATEN_HELPER_NAMESPACES = {"cuda", "indexing", "detail"}


def _is_aten_op(match: re.Match) -> bool:
    namespaces = match.group(1).split("::")[:-1]
    op = match.group(2)
    if namespaces[:1] == ["native"]:
        return False  # reported by the at::native:: pattern already
    if namespaces[:2] == ["cuda", "blas"]:
        return True
    if namespaces[:1] and namespaces[0] in _ATEN_HELPER_NAMESPACES:
        return False
    return op not in _ATEN_HELPERS and not re.fullmatch(r"k[A-Z]\w*", op)


def _check_library_calls(module: _Module) -> list[_Hit]:
    return _in_strings(module, _LIBRARY_SOURCE) + _in_strings(module, _ATEN_CALL, keep=_is_aten_op)


# --------------------------------------------------------------------------- control flow and classes


def _check_exception_fallback(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        if not isinstance(node, _TRY_NODES):
            continue
        keyword = "except*" if isinstance(node, ast.TryStar) else "except"
        for handler in node.handlers:
            if len(handler.body) == 1 and isinstance(handler.body[0], ast.Raise):
                continue  # re-raises, or raises a new exception: no fallback
            caught = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
            hits.append(_Hit(handler.lineno, f"{keyword}{caught}:"))
    hits += [_Hit(ref.line, ref.name) for ref in module.refs if _matches(ref.name, ("contextlib.suppress",))]
    return hits


def _classes(tree: ast.Module, name: str) -> list[ast.ClassDef]:
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name]
    return sorted(found, key=lambda node: node.lineno)


def _body_key(cls: ast.ClassDef) -> str:
    """The class body without line numbers or docstring, for comparing two classes."""
    body = cls.body
    if body and isinstance(body[0], ast.Expr) and _literal_str(body[0].value) is not None:
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


def _reference_copies(module: _Module) -> dict[str, int]:
    """Classes of the submission whose body is the reference Model's: name -> line."""
    references = _classes(module.reference, "Model") if module.reference is not None else []
    if not references:
        return {}
    key = _body_key(references[-1])
    if not key:
        return {}
    return {node.name: node.lineno for node in module.nodes
            if isinstance(node, ast.ClassDef) and _body_key(node) == key}


def _is_nn_module(module: _Module, base: ast.expr) -> bool:
    parts = _chain(base)
    return module.resolve(base) in _NN_MODULE or (parts is not None and ".".join(parts) in _NN_MODULE_AS_WRITTEN)


def _check_reference_model(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            hits.append(_Hit(node.lineno, "class Model defined"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any("Model" in (alias.name.split(".")[-1], alias.asname) for alias in node.names):
                hits.append(_Hit(node.lineno, "Model imported"))
        elif isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            hits.append(_Hit(node.lineno, "Model referenced"))
        elif isinstance(node, ast.Attribute) and node.attr == "Model" and isinstance(node.ctx, ast.Load):
            hits.append(_Hit(node.lineno, f"{'.'.join(_chain(node) or ['', 'Model'])} referenced"))
    copies = _reference_copies(module)
    hits += [_Hit(line, f"copies the reference Model as {name}") for name, line in copies.items()]
    for cls in _classes(module.tree, "ModelNew"):
        for base in cls.bases:
            if _is_nn_module(module, base):
                continue
            written = ast.unparse(base)
            copy = ", a copy of the reference Model" if written in copies else ""
            hits.append(_Hit(cls.lineno, f"ModelNew subclasses {written}{copy}"))
    return hits


_Params = list[tuple[str, str]]  # (name, kind) after self


def _params(function: ast.FunctionDef) -> _Params:
    args = function.args
    positional = [(a.arg, "positional-only") for a in args.posonlyargs] + [(a.arg, "positional") for a in args.args]
    params = positional[1:]  # self
    if args.vararg is not None:
        params.append((args.vararg.arg, "var-positional"))
    params += [(a.arg, "keyword-only") for a in args.kwonlyargs]
    if args.kwarg is not None:
        params.append((args.kwarg.arg, "var-keyword"))
    return params


def _init_params(module: _Module, cls: ast.ClassDef, tree: ast.Module, depth: int = 0) -> Optional[_Params]:
    """The parameters cls(...) takes; None when they come from a class this file does not define."""
    inits = [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__init__"]
    if inits:
        return _params(inits[-1])
    for base in cls.bases:
        if _is_nn_module(module, base):
            continue
        parents = _classes(tree, base.id) if isinstance(base, ast.Name) else []
        if not parents or depth > 10:
            return None
        return _init_params(module, parents[-1], tree, depth + 1)
    return []


def _signature(params: _Params) -> str:
    shown = []
    for i, (name, kind) in enumerate(params):
        before = params[i - 1][1] if i else None
        if kind == "keyword-only" and before not in ("keyword-only", "var-positional"):
            shown.append("*")
        shown.append({"var-positional": "*", "var-keyword": "**"}.get(kind, "") + name)
        after = params[i + 1][1] if i + 1 < len(params) else None
        if kind == "positional-only" and after != "positional-only":
            shown.append("/")
    return ", ".join(shown)


def _check_init_signature(module: _Module) -> list[_Hit]:
    if module.reference is None:
        return []
    references, candidates = _classes(module.reference, "Model"), _classes(module.tree, "ModelNew")
    if not references or not candidates:
        return []
    inits = [s for s in references[-1].body if isinstance(s, ast.FunctionDef) and s.name == "__init__"]
    expected = _params(inits[-1]) if inits else []
    actual = _init_params(module, candidates[-1], module.tree)
    if actual is None or actual == expected:
        return []
    return [_Hit(None, f"ModelNew({_signature(actual)}) vs Model({_signature(expected)})")]


# --------------------------------------------------------------------------- identity-keyed state

_IDENTITY_METHODS = {"data_ptr", "untyped_storage", "storage"}
_KEY_WRAPPERS = {"str", "hash", "tuple", "repr", "int", "frozenset"}
_EQUALITY_OPS = (ast.In, ast.NotIn, ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


def _identity_values(module: _Module) -> Iterator[tuple[ast.expr, str]]:
    for node in module.nodes:
        if isinstance(node, ast.Call) and module.resolve(node.func) == "builtins.id":
            yield node, "id(...)"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in _IDENTITY_METHODS):
            yield node, f".{node.func.attr}()"
        elif isinstance(node, ast.Attribute) and node.attr == "_cdata":
            yield node, "._cdata"


def _enclosing_key(module: _Module, node: ast.expr) -> ast.expr:
    """The largest expression node is part of as a key: (id(x), n), f"{id(x)}", str(id(x)), a + (id(x),)."""
    while True:
        parent = module.parents.get(node)
        if isinstance(parent, (ast.Tuple, ast.List, ast.Set, ast.Starred, ast.FormattedValue, ast.JoinedStr)):
            node = parent
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add):
            node = parent
        elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and (
                parent.func.id in _KEY_WRAPPERS and any(arg is node for arg in parent.args)):
            node = parent
        else:
            return node


def _key_use(module: _Module, node: ast.expr) -> Optional[str]:
    """How node is used as a key, if it is."""
    parent = module.parents.get(node)
    if isinstance(parent, ast.Dict) and any(key is node for key in parent.keys) or (
            isinstance(parent, ast.DictComp) and parent.key is node):
        return "as a dict key"
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return "as a subscript index"
    if isinstance(parent, ast.Compare) and any(isinstance(op, _EQUALITY_OPS) for op in parent.ops):
        return "in a comparison"
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and (
            parent.func.attr in ("get", "setdefault") and any(arg is node for arg in parent.args)):
        return f"as a .{parent.func.attr}() argument"
    return None


def _check_identity_keys(module: _Module) -> list[_Hit]:
    hits, holders = [], {}
    for node, label in _identity_values(module):
        key = _enclosing_key(module, node)
        use = _key_use(module, key)
        if use is not None:
            hits.append(_Hit(node.lineno, f"{label} {use}"))
        parent = module.parents.get(key)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is key:  # key = (x.data_ptr(), n)
            for target in _assignment_targets(parent):
                parts = _chain(target)
                if parts is not None:
                    holders[".".join(parts)] = label
    for ref in module.refs:
        if ref.raw in holders and isinstance(ref.node.ctx, ast.Load):
            use = _key_use(module, _enclosing_key(module, ref.node))
            if use is not None:
                hits.append(_Hit(ref.line, f"{ref.raw} (holds {holders[ref.raw]}) {use}"))
    return hits


_CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    "imports_beyond_torch": _check_imports,
    "process_spawn": _names_check(*_PROCESS_NAMES),
    "threads": _names_check(*_THREAD_NAMES),
    "network": _names_check(*_NETWORK_NAMES),
    "native_access": _names_check(*_NATIVE_NAMES),
    "introspection": _check_introspection,
    "sys_modules": _check_sys_modules,
    "monkeypatch": _check_monkeypatch,
    "exits": _check_exits,
    "env_access": _names_check(*_ENV_NAMES),
    "file_io": _check_file_io,
    "seed_control": _names_check(*_SEED_NAMES),
    "precision_downgrade": _check_precision,
    "side_stream": _check_side_stream,
    "library_calls": _check_library_calls,
    "exception_fallback": _check_exception_fallback,
    "uses_reference_model": _check_reference_model,
    "init_signature_mismatch": _check_init_signature,
    "identity_keyed_state": _check_identity_keys,
    "obfuscation": _check_obfuscation,
}
