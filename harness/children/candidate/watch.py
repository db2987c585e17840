"""Run-time integrity checks inside the candidate's process (harness code next to untrusted code).

Before the submission's module executes, `Watch` records the objects behind a list of attributes that a judge
relies on (timers, synchronisation, comparisons), every name of the judge's own modules loaded in this process (their
module globals and the attributes of their classes: harness.*, and the candidate's main program, which runs as
`__main__`), the precision settings and the live Python threads. Later, `changes()` names what differs, and
`remember()` keeps it for `report()`: the candidate's process calls it right before each step whose result the parent
trusts (copying outputs, saving them), so a replacement made during a forward and undone by itself once used is
still in place when it is looked for.

The candidate's process does not call a `Watch` that submission code can reach: `sealed()` takes the snapshot into a
private copy of this module (its functions and `Watch` re-created over a copy of its names and of the builtins), and
hands back one function, which the audit hook keeps in its closure (harness/children/candidate/guard.py) and calls on
the INTEGRITY_EVENT audit event; submission code cannot add an audit hook of its own. Rebinding `Watch`'s methods,
this module's functions, the snapshot's dicts or the harness's callers of it therefore reaches nothing the harness
calls (and is itself a change the sealed snapshot reports). This is detection, not prevention: a patch undone before
a check is not seen, and torch's own attributes that `precision_state` reads are looked up by name. The parent also
cross-checks wall time, spot-checks timed outputs, times calls on input sets never seen before and applies a roofline
floor that no in-process patch can move (docs/threat-model.md lists which layer answers which replacement).
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
import time
import types
from operator import is_
from typing import Any, Callable, Optional

import torch
import torch._compile

from harness.shared.findings import BACKGROUND_THREAD, PATCHED_RUNTIME, PRECISION_CHANGED, Found

# (module name, attribute path) pairs whose objects must stay the same while the submission runs: torch's, time's and
# the builtins the judge relies on. The judge's own modules are watched whole (every module global and class attribute:
# `harness_modules`), so what the candidate's process calls after submission code needs no entry here.
WATCHED = {
    "builtins": ["open", "print", "isinstance", "type", "len", "getattr", "setattr", "__import__", "id", "hash"],
    "time": ["perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "sleep"],
    "torch": ["allclose", "isclose", "equal", "abs", "max", "empty", "empty_like", "clone", "save", "load",
              "manual_seed", "testing.assert_close", "Tensor.__eq__", "Tensor.__sub__", "Tensor.abs", "Tensor.cpu",
              "Tensor.to", "Tensor.clone", "Tensor.copy_", "Tensor.detach", "Tensor.contiguous", "Tensor.as_subclass",
              "Tensor.item", "Tensor.tolist", "Tensor.__torch_function__", "cuda.synchronize", "cuda.Event",
              "cuda.Event.record", "cuda.Event.elapsed_time", "cuda.Event.synchronize", "cuda.Event.query",
              "cuda.current_stream", "cuda.Stream", "cuda.Stream.synchronize", "_C._cuda_synchronize",
              "profiler.profile", "profiler.record_function", "autograd.profiler.profile",
              "utils.cpp_extension.load_inline",
              "utils.cpp_extension.load", "cuda._sleep"],
}
# (module name, attribute) pairs whose contents must stay equal: the GPU clock the head start's spin counts, read
# before the submission runs (harness/children/candidate/main.py warm_up); raised, it would give the candidate's
# timed calls a longer head start than the reference's, hiding more of its host time.
WATCHED_VALUES = [("harness.shared.timer", "_cycles_per_ms")]
# The two cpp_extension entry points are wrapped by the harness itself before the submission runs; `Watch` is
# created after that, so its snapshot holds what the harness itself will see. Importing torch._dynamo (torch.compile,
# torch.profiler.profile) wraps torch.manual_seed in torch's own `_disable_dynamo`: that wrapper of the same function
# is not a patch.
_DISABLE_DYNAMO_FILE = torch._compile.__file__
HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Names Python adds to a class after it is made (pickling caches its slot names): not a patch.
_CLASS_CACHES = frozenset({"__slotnames__"})
_MISSING = object()


def harness_modules() -> dict[str, types.ModuleType]:
    """The judge's own modules in this process: every harness module imported so far, and `__main__` when it is one
    of them (the candidate's main program is started by module name, so its globals live in `__main__`)."""
    found = {name: module for name, module in list(sys.modules.items())
             if isinstance(module, types.ModuleType) and (name == "harness" or name.startswith("harness."))}
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if isinstance(main_file, str) and os.path.abspath(main_file).startswith(HARNESS_DIR + os.sep):
        found["__main__"] = main
    return found


def _namespaces() -> dict[str, Any]:
    """Name -> namespace, for every harness module, every class defined in one, and every object of such a class a
    module holds (the candidate's `CONTEXT`: its own-call counter, its snapshot): what `Watch` snapshots."""
    spaces: dict[str, Any] = {}
    for name, module in harness_modules().items():
        spaces[name] = module
        own = getattr(module, "__name__", name)
        for key, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == own:
                spaces.setdefault(f"{name}.{value.__qualname__}", value)
            elif type(value).__module__ == own and isinstance(getattr(value, "__dict__", None), dict):
                spaces.setdefault(f"{name}.{key}", value)
    return spaces


def _resolve(module_name: str, path: str) -> Any:
    obj: Any = sys.modules.get(module_name)
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _contents(module_name: str, path: str) -> Any:
    """A copy of what a watched list holds now (None for what is no list)."""
    value = _resolve(module_name, path)
    return tuple(value) if isinstance(value, list) else None


def _same_body(now: Optional[tuple], then: Optional[tuple]) -> bool:
    return now is None and then is None or (now is not None and then is not None
                                            and all(a is b for a, b in zip(now, then)))


def _same(now: Any, then: Any) -> bool:
    """Identity; bound methods (classmethods are re-bound on every access) by function and owner; torch's own
    dynamo wrapper around the same function."""
    if isinstance(now, types.MethodType) and isinstance(then, types.MethodType):
        return now.__func__ is then.__func__ and now.__self__ is then.__self__
    if isinstance(now, types.FunctionType) and now is not then and getattr(now, "__wrapped__", None) is then:
        return now.__code__.co_filename == _DISABLE_DYNAMO_FILE
    return now is then


def _body(obj: Any) -> Optional[tuple]:
    """What a function runs, beside which object it is: its code, defaults and keyword defaults (a submission can
    swap a function's `__code__` in place, keeping the object the harness holds); None for what is no function."""
    function = obj.__func__ if isinstance(obj, types.MethodType) else obj
    if not isinstance(function, types.FunctionType):
        return None
    return function.__code__, function.__defaults__, function.__kwdefaults__


def precision_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
    if torch.cuda.is_available():
        state["autocast_cuda"] = torch.is_autocast_enabled("cuda")
    return state


class Watch:
    """A snapshot of the watched objects, the precision settings and the live threads."""

    def __init__(self) -> None:
        self.objects = {(module, path): _resolve(module, path) for module, paths in WATCHED.items() for path in paths}
        self.bodies = {key: _body(obj) for key, obj in self.objects.items()}
        self.modules = {name: sys.modules.get(name) for name in WATCHED}
        self.values = {key: _contents(*key) for key in WATCHED_VALUES}
        self.harness = harness_modules()
        self.spaces = _namespaces()
        self.names = {where: dict(vars(space)) for where, space in self.spaces.items()}
        self.order = {where: (tuple(names), tuple(names.values())) for where, names in self.names.items()}
        self.functions = {(where, name): (value, value.__code__, value.__defaults__, value.__kwdefaults__)
                          for where, names in self.names.items() for name, value in names.items()
                          if isinstance(value, types.FunctionType)}
        self.seen = Found()
        self.precision = precision_state()
        self.threads = set(threading.enumerate())
        self._builtins = builtins
        self._time = time

    def changes(self) -> dict[str, str]:
        """Finding name -> evidence, for what differs from the snapshot now."""
        found = Found()
        patched = [f"sys.modules[{name!r}]" for name, module in (*self.modules.items(), *self.harness.items())
                   if sys.modules.get(name) is not module]
        patched += [f"{module}.{path}" for (module, path), obj in self.objects.items()
                    if not _same(_resolve(module, path), obj)]
        patched += [f"{module}.{path} (its code)" for (module, path), obj in self.objects.items()
                    if _resolve(module, path) is obj and not _same_body(_body(obj), self.bodies[(module, path)])]
        patched += [f"{module}.{path} (its contents)" for (module, path), value in self.values.items()
                    if _contents(module, path) != value]
        patched += self._harness_names()
        patched = list(dict.fromkeys(patched))   # a watched harness attribute is in both lists
        if patched:
            found[PATCHED_RUNTIME] = "replaced: " + ", ".join(patched[:8]) + (
                f" (+{len(patched) - 8} more)" if len(patched) > 8 else "")
        now = precision_state()
        changed = [f"{key}: {self.precision[key]} -> {value}" for key, value in now.items()
                   if self.precision.get(key) != value]
        if changed:
            found[PRECISION_CHANGED] = "; ".join(changed)
        alive = [t for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        if alive:
            found[BACKGROUND_THREAD] = f"{len(alive)} thread(s) alive after forward: " + ", ".join(
                t.name for t in alive[:4])
        return found

    def _harness_names(self) -> list[str]:
        """The judge's own names that changed: a module global or class attribute rebound or deleted, a function's
        code swapped, a class given a new attribute, a module a new global that shadows a builtin (what its code
        would call instead). Identity first: this runs before every step the parent trusts, each timed block's
        report included, so it stays near a millisecond."""
        changed = []
        shadowing = vars(self._builtins)
        for where, then in self.names.items():
            space = self.spaces[where]
            now = vars(space)
            names, values = self.order[where]
            if len(now) == len(names) and all(map(is_, now, names)) and all(map(is_, now.values(), values)):
                continue   # the same names bound to the same objects, compared in C
            for name, value in then.items():
                current = now.get(name, _MISSING)
                if current is not value and not _same(current, value):
                    changed.append(f"{where}.{name}")
            if isinstance(space, (type, types.ModuleType)) and now.keys() != then.keys():   # an object's new
                is_class = isinstance(space, type)                                              # attributes: its own
                changed += [f"{where}.{name} (added)" for name in now.keys() - then.keys()
                            if ((name not in _CLASS_CACHES) if is_class else (name in shadowing))]
        for (where, name), (function, code, defaults, kwdefaults) in self.functions.items():
            if (function.__code__ is not code or function.__defaults__ is not defaults
                    or function.__kwdefaults__ is not kwdefaults):
                changed.append(f"{where}.{name} (its code)")
        return changed

    def remember(self) -> None:
        """Keep what differs now for `report()`: called right before a step whose result the parent trusts."""
        for name, evidence in self.changes().items():
            if name not in self.seen:
                self.seen[name] = evidence
            elif evidence not in self.seen[name]:
                self.seen[name] = f"{self.seen[name]}; {evidence}"

    def report(self) -> dict[str, str]:
        """Everything `remember()` kept and what differs now: the findings an event carries to the parent."""
        self.remember()
        return dict(self.seen)


def sealed() -> Callable[[Optional[list]], None]:
    """A second `Watch`, its snapshot taken now, that only the returned function reaches: called with None it
    remembers what differs now (`Watch.remember`), called with a list it appends what it has seen (`Watch.report`, a
    plain dict). Its class and every function of this module it calls are re-created over a private copy of this
    module's names, with a private copy of the builtins and of the few attributes of sys, os, threading and types it
    reads, all bound now; the findings are collected in plain dicts (`Found`'s methods are a harness class's). So no
    rebinding made later, of a name here, of `Watch`'s methods or of anything a `Watch` instance holds, reaches it.
    The caller keeps the function where submission code cannot look (the audit hook's closure)."""
    names = dict(vars(sys.modules[__name__]))
    names["__builtins__"] = dict(vars(builtins))
    names["Found"] = dict
    names["sys"] = types.SimpleNamespace(modules=sys.modules)
    names["threading"] = types.SimpleNamespace(enumerate=threading.enumerate)
    names["types"] = types.SimpleNamespace(FunctionType=types.FunctionType, MethodType=types.MethodType,
                                           ModuleType=types.ModuleType)
    names["os"] = types.SimpleNamespace(sep=os.sep, path=types.SimpleNamespace(abspath=os.path.abspath))

    def private(function: types.FunctionType) -> types.FunctionType:
        copy = types.FunctionType(function.__code__, names, function.__name__, function.__defaults__,
                                  function.__closure__)
        copy.__kwdefaults__ = function.__kwdefaults__
        return copy

    for name, value in list(names.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == __name__:
            names[name] = private(value)
    attributes = {name: private(value) if isinstance(value, types.FunctionType) else value
                  for name, value in vars(Watch).items() if name not in ("__dict__", "__weakref__")}
    names["Watch"] = watch_class = type("Watch", (), attributes)
    watch = watch_class()
    remember, report, is_list = attributes["remember"], attributes["report"], list.__instancecheck__

    def check(into: Optional[list]) -> None:
        if into is None:
            remember(watch)
        elif is_list(into):
            into.append(report(watch))
    return check
