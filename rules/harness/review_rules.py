"""The review's rules as data: each rule id and what it catches, the modules, attributes and names
that trip it, and the constant folding that sees a name through string tricks. Stdlib only; it
must never import, run or read a candidate (review_ast.py walks the source with these tables).
"""

from __future__ import annotations

import ast

SCHEMA = "rsi.review/1"
RANK = {"pass": 0, "inconclusive": 1, "fail": 2}

# NB: rule id -> what it catches (the ids are what `allow` names and what findings carry)
RULES = {
    "frame_introspection": "reads interpreter frames, tracebacks or code objects (inspect, "
    "sys._getframe, f_back/f_locals, traceback stacks)",
    "gc_introspection": "walks the garbage collector or live objects (gc, tracemalloc)",
    "native_access": "reaches raw memory or native calls (ctypes, cffi)",
    "process_control": "signals, kills, forks, execs or exits processes (os.kill, signal, "
    "subprocess, os.fork, sys.exit)",
    "clock_manipulation": "replaces or patches a clock or another module's attribute",
    "threads_beyond_binding": "starts threads or processes, or raises thread counts, beyond "
    "the binding's `threads`",
    "reads_outside_scope": "opens files, lists folders or reads the environment outside its "
    "own folder",
    "dynamic_code": "builds code or names at run time (eval, exec, compile, __import__ or "
    "getattr of a computed name, globals())",
    "imports_harness": "imports the referee, the worker or the task's oracle and workloads",
    "forbidden_import": "imports a module the task's review rules forbid",
    "forbidden_call": "calls a function the task's review rules forbid",
    "delegates_to_baseline": "imports, loads or copies the baseline's computation",
    "unchanged_computation": "is the baseline's computation, renamed or reformatted",
    "special_cases_public_shape": "compares shapes against the task's public case shapes",
    "replays_seed": "seeds a random generator (a public seed replays the judge's inputs)",
    "unparseable": "a candidate file that cannot be parsed",
    "reviewer": "the external reviewer's own finding",
    "reviewer_failed": "the external reviewer did not answer (exit, timeout, output)",
}

# NB: module -> rule for a plain import
FORBIDDEN_MODULES = {
    "inspect": "frame_introspection",
    "traceback": "frame_introspection",
    "dis": "frame_introspection",
    "gc": "gc_introspection",
    "tracemalloc": "gc_introspection",
    "ctypes": "native_access",
    "cffi": "native_access",
    "_ctypes": "native_access",
    "signal": "process_control",
    "subprocess": "process_control",
    "pty": "process_control",
    "resource": "process_control",
    "atexit": "process_control",
    "faulthandler": "process_control",
    "psutil": "process_control",
    "multiprocessing": "threads_beyond_binding",
    "socket": "reads_outside_scope",
    "shutil": "reads_outside_scope",
    "glob": "reads_outside_scope",
    "pathlib": "reads_outside_scope",
    "tempfile": "reads_outside_scope",
    "builtins": "dynamic_code",
    "importlib": "dynamic_code",
    "runpy": "dynamic_code",
    "code": "dynamic_code",
    "codeop": "dynamic_code",
    "referee": "imports_harness",
    "worker": "imports_harness",
    "_common": "imports_harness",
    "_core": "imports_harness",
    "oracle": "imports_harness",
    "workloads": "imports_harness",
    "rsi": "imports_harness",
    "rules": "imports_harness",
    "baseline": "delegates_to_baseline",
}
THREAD_MODULES = ("threading", "_thread", "concurrent")
# NB: dotted call or attribute -> rule (module attributes read or called)
FORBIDDEN_ATTRS = {
    "sys._getframe": "frame_introspection",
    "sys._current_frames": "frame_introspection",
    "sys.settrace": "frame_introspection",
    "sys.setprofile": "frame_introspection",
    "sys.gettrace": "frame_introspection",
    "sys.exc_info": "frame_introspection",
    "sys.exception": "frame_introspection",
    "sys.last_traceback": "frame_introspection",
    "sys.modules": "dynamic_code",
    "sys.meta_path": "dynamic_code",
    "sys.path_hooks": "dynamic_code",
    "sys.path": "delegates_to_baseline",
    "sys.argv": "reads_outside_scope",
    "sys.exit": "process_control",
    "sys.setswitchinterval": "process_control",
    "sys.addaudithook": "process_control",
    "sys.stdin": "reads_outside_scope",
    "os.kill": "process_control",
    "os.killpg": "process_control",
    "os.fork": "process_control",
    "os.forkpty": "process_control",
    "os._exit": "process_control",
    "os.abort": "process_control",
    "os.system": "process_control",
    "os.popen": "process_control",
    "os.getppid": "process_control",
    "os.setsid": "process_control",
    "os.setpgid": "process_control",
    "os.nice": "process_control",
    "os.setpriority": "process_control",
    "os.sched_setaffinity": "process_control",
    "os.pidfd_open": "process_control",
    "os.environ": "reads_outside_scope",
    "os.getenv": "reads_outside_scope",
    "os.putenv": "reads_outside_scope",
    "os.listdir": "reads_outside_scope",
    "os.scandir": "reads_outside_scope",
    "os.walk": "reads_outside_scope",
    "os.open": "reads_outside_scope",
    "os.readlink": "reads_outside_scope",
    "os.getcwd": "reads_outside_scope",
    "os.chdir": "reads_outside_scope",
    "os.remove": "reads_outside_scope",
    "os.unlink": "reads_outside_scope",
    "os.rename": "reads_outside_scope",
    "os.replace": "reads_outside_scope",
    "os.mkdir": "reads_outside_scope",
    "os.makedirs": "reads_outside_scope",
    "io.open": "reads_outside_scope",
    "io.FileIO": "reads_outside_scope",
    "time.clock_settime": "clock_manipulation",
    "time.clock_settime_ns": "clock_manipulation",
    "numpy.random.seed": "replays_seed",
    "numpy.random.default_rng": "replays_seed",
    "numpy.random.RandomState": "replays_seed",
    "numpy.random.Generator": "replays_seed",
    "random.seed": "replays_seed",
    "random.Random": "replays_seed",
    "torch.manual_seed": "replays_seed",
    "torch.cuda.manual_seed": "replays_seed",
    "torch.cuda.manual_seed_all": "replays_seed",
    "torch.Generator": "replays_seed",
    "torch.set_num_threads": "threads_beyond_binding",
    "torch.set_num_interop_threads": "threads_beyond_binding",
}
PREFIX_ATTRS = {"os.exec": "process_control", "os.spawn": "process_control"}
# NB: frame, code and namespace attributes, in any object or any string
FRAME_NAMES = {
    "f_back",
    "f_locals",
    "f_globals",
    "f_code",
    "f_builtins",
    "f_trace",
    "gi_frame",
    "cr_frame",
    "ag_frame",
    "tb_frame",
    "tb_next",
    "__traceback__",
    "_getframe",
    "_current_frames",
    "settrace",
    "setprofile",
    "get_objects",
    "get_referrers",
    "get_referents",
    "__subclasses__",
}
NAMESPACE_NAMES = {"__globals__", "__builtins__", "__code__", "__closure__", "__dict__"}
DYNAMIC_BUILTINS = {"eval", "exec", "compile", "__import__", "globals", "locals", "vars"}
FILE_BUILTINS = {"open"}
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR")
# NB: modules whose attributes a candidate never assigns (the clock, the process, the
# interpreter, and whatever introspects them)
PATCH_MODULES = {
    "time",
    "os",
    "sys",
    "builtins",
    "gc",
    "signal",
    "threading",
    "inspect",
    "importlib",
    "ctypes",
    "subprocess",
    "multiprocessing",
    "traceback",
    "referee",
    "worker",
    "_common",
    "_core",
}


def finding(rule: str, severity: str, file: str, line: int, detail: str) -> dict:
    return {"rule": rule, "severity": severity, "file": file, "line": line, "detail": detail}


def fold(node: ast.AST) -> str | None:
    """A string expression's value when it is built from literals (concatenation, join,
    slicing, chr, format of literals); None when it depends on anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = fold(node.left), fold(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = fold(node.left)
        return left  # NB: enough to see a name through a format string
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and fold(v.value) is not None:
                parts.append(fold(v.value))
            else:
                return None
        return "".join(parts)
    if isinstance(node, ast.Subscript):
        base = fold(node.value)
        sl = node.slice
        if base is not None and isinstance(sl, ast.Slice):
            try:
                bounds = [
                    None if p is None else ast.literal_eval(p)
                    for p in (sl.lower, sl.upper, sl.step)
                ]
                return base[slice(*bounds)]
            except (ValueError, TypeError):
                return None
        return None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "chr" and len(node.args) == 1:
            try:
                return chr(ast.literal_eval(node.args[0]))
            except (ValueError, TypeError):
                return None
        if isinstance(func, ast.Name) and func.id == "str" and len(node.args) == 1:
            return fold(node.args[0])
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "join"
            and len(node.args) == 1
            and isinstance(node.args[0], (ast.List, ast.Tuple))
        ):
            sep, parts = fold(func.value), [fold(e) for e in node.args[0].elts]
            if sep is None or any(p is None for p in parts):
                return None
            return sep.join(parts)  # type: ignore[arg-type]
        if isinstance(func, ast.Attribute) and func.attr in ("lower", "upper", "strip"):
            base = fold(func.value)
            return None if base is None else getattr(base, func.attr)()
    return None
