#!/usr/bin/env python3
"""Lists Rust types with more methods than a bound (issue 25: no type over 40 methods).

Usage: scripts/type-methods.py [--max N] [--all] PATH...

Each PATH is a .rs file or a directory searched for them. A type's methods are the
functions directly inside every `impl` block for it (inherent and trait impls, in any
file of its crate under the PATHs), counted together by crate and type name. Prints one line per type
over the bound (`METHODS name  file:count ...`), most first, and exits 1 if any; --all
prints every type. Comments and literals are skipped (as scripts/fn-lengths.py does).
Run with no PATH it checks crates/server, crates/nic, crates/ferry and crates/sandbox.
"""

import importlib.util
import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fn_lengths", os.path.join(HERE, "fn-lengths.py"))
fn_lengths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fn_lengths)

IMPL = re.compile(r"\bimpl\b")
FN = re.compile(r"\bfn\s+[A-Za-z_][A-Za-z0-9_]*")
DEFAULT = ["crates/server", "crates/nic", "crates/ferry", "crates/sandbox"]


def skip_generics(code, j):
    """The index after a `<...>` starting at j (j at '<'), nesting counted."""
    depth = 0
    while j < len(code):
        if code[j] == "<":
            depth += 1
        elif code[j] == ">" and code[j - 1] != "-":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def self_type(header):
    """The implemented type's bare name from an impl header (between `impl` and `{`)."""
    header = header.strip()
    if header.startswith("<"):
        header = header[skip_generics(header, 0):]
    header = re.split(r"\bwhere\b", header)[0]
    m = re.search(r"\bfor\b(.*)$", header, re.S)
    target = m.group(1) if m else header
    target = re.sub(r"^[\s&'a-z_]*(mut\s+)?", lambda s: "" if "mut" in s.group(0) or "&" in s.group(0) else s.group(0), target.strip())
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", target.split("<")[0])
    return names[-1] if names else None


def impls(path):
    """(type, methods) for every impl block in `path`."""
    with open(path, encoding="utf-8") as f:
        code = fn_lengths.code_only(f.read())
    found = []
    for m in IMPL.finditer(code):
        j = m.end()
        if j < len(code) and code[j] == "<":
            j = skip_generics(code, j)
        start = j
        while j < len(code) and code[j] not in "{;":
            if code[j] == "<":
                j = skip_generics(code, j)
                continue
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        # `impl Trait` in argument or return position has no block of its own.
        if re.search(r"[(:,>]\s*$|->\s*$|dyn\s*$", code[max(0, m.start() - 12):m.start()]):
            continue
        name = self_type(code[start:j])
        if not name:
            continue
        # Count `fn` at depth 1 of the impl's body.
        depth, k, count = 0, j, 0
        while k < len(code):
            ch = code[k]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    break
            elif depth == 1 and ch == "f" and FN.match(code, k) and (k == 0 or not (code[k - 1].isalnum() or code[k - 1] == "_")):
                count += 1
            k += 1
        found.append((name, count))
    return found


def crate_of(path):
    """The directory of the nearest Cargo.toml above `path` (types are per crate)."""
    d = os.path.dirname(os.path.abspath(path))
    while d != os.path.dirname(d):
        if os.path.exists(os.path.join(d, "Cargo.toml")):
            return os.path.basename(d)
        d = os.path.dirname(d)
    return ""


def main(argv):
    bound, show_all, paths = 40, False, []
    it = iter(argv)
    for a in it:
        if a == "--max":
            bound = int(next(it))
        elif a == "--all":
            show_all = True
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            paths.append(a)
    paths = paths or DEFAULT
    total = defaultdict(int)
    where = defaultdict(lambda: defaultdict(int))
    for path in fn_lengths.rust_files(paths):
        for name, count in impls(path):
            key = f"{crate_of(path)}::{name}"
            total[key] += count
            where[key][path] += count
    rows = sorted(((n, t) for t, n in total.items() if show_all or n > bound), key=lambda r: (-r[0], r[1]))
    for n, t in rows:
        files = " ".join(f"{os.path.basename(p)}:{c}" for p, c in sorted(where[t].items(), key=lambda x: -x[1]) if c)
        print(f"{n:5} {t}  {files}")
    return 1 if any(n > bound for n, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
