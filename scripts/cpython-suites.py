#!/usr/bin/env python3
"""Runs CPython's own network test suites natively and through `ferry run`, case for
case, and compares the outcomes.

    scripts/cpython-suites.py [--out DIR] [--suites S,...] [--case-limit SECONDS]
                              [--reruns N] [--ferry-opts '...'] [--report-only]

Each suite runs as `python3 -m test -v UNIT` with
Debian's interpreter and test package (libpython3.11-testsuite), once natively and once
as `ferry run [OPTS] -- python3 ...`, with the same environment, working directory and
resources (regrtest's default: none, so no internet; test_socketserver, loopback only,
gets "network"). A small hook
(cpython_suites_hook.py) reports every case's start and outcome. A case that exceeds
its time (--case-limit) ends the run: it is "hung", and the unit resumes after it (a
crash likewise; --limit bounds a whole run). Cases whose outcomes differ are re-run
alone, natively and through ferry, --reruns times each, to tell flakes from real
differences (not those the known list puts down to the sandbox's identity or the
environment).

Writes into --out (default target/cpython-suites): report.md (a table per suite and
every differing case with both outcomes, the re-run counts and, from
scripts/cpython-suites-known.tsv, the known reason), results.csv (one row per case),
results.json (everything; --report-only re-renders the report from it) and logs/ (the
output of every run). Exits 1 when a case differs in a way the known list does not
explain, 0 otherwise.
"""
import argparse
import csv
import fnmatch
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOK = os.path.join(ROOT, "scripts", "cpython_suites_hook.py")
KNOWN = os.path.join(ROOT, "scripts", "cpython-suites-known.tsv")
SUITES = ["test_asyncio", "test_os", "test_socket", "test_selectors", "test_ssl",
          "test_subprocess", "test_signal", "test_httplib", "test_socketserver",
          "test_urllib2_localnet"]
# regrtest's resources beyond its default (none): test_socketserver asks for "network"
# as a whole though it only uses loopback (socket_helper.HOST); in the other suites
# "network" means the internet, which stays off.
RESOURCES = {"test_socketserver": "network"}
SIDES = ("native", "ferry")
FRAME = re.compile(rb"\x1eCASE (.*?)\x1f")
# The same environment for both runs: no pyenv or user paths, no byte-code writes into
# the system's test package.
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
RESUMES = 5
RERUN_CASE_LIMIT = 120
# Classes of scripts/cpython-suites-known.tsv whose cases are not re-run.
SETTLED = ("identity", "environment")


def say(msg):
    print(f"cpython-suites: {msg}", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "target", "cpython-suites"))
    p.add_argument("--suites", default=",".join(SUITES),
                   help="comma-separated suites or units (test_asyncio.test_streams)")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--ferry", default=os.path.join(ROOT, "target", "release", "ferry"))
    p.add_argument("--ferry-opts", default="", help="options of `ferry run`, one string")
    p.add_argument("--case-limit", type=float, default=300,
                   help="seconds one case may take before it counts as hung (default 300)")
    p.add_argument("--limit", type=float, default=3600,
                   help="seconds one run of a unit may take (default 3600)")
    p.add_argument("--reruns", type=int, default=3,
                   help="re-runs of each differing case on each side (default 3)")
    p.add_argument("--split-asyncio", action="store_true",
                   help="run test_asyncio module by module (one process each) instead of "
                   "as one process: faster to resume after a hang, but state that builds "
                   "up over the whole suite in one process is not seen")
    p.add_argument("--known", default=KNOWN,
                   help="the list of explained differences (default %(default)s)")
    p.add_argument("--report-only", action="store_true",
                   help="re-render report.md and results.csv from OUT/results.json")
    return p.parse_args(argv)


# --- units and commands ------------------------------------------------------------------

def units_of(suites, python, split):
    """The runnable units: a suite, or with split test_asyncio one unit per module."""
    units = []
    for s in suites:
        if s != "test_asyncio" or not split:
            units.append((s.split(".")[0], s))
            continue
        code = ("import os, test.test_asyncio as p; d = os.path.dirname(p.__file__); "
                "print(' '.join(sorted(f[:-3] for f in os.listdir(d) "
                "if f.startswith('test_') and f.endswith('.py'))))")
        mods = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              check=True, env=ENV).stdout.split()
        units += [(s, f"{s}.{m}") for m in mods]
    return units


def command(side, unit, args, extra, case_limit=None):
    """argv of one run: regrtest with the hook, directly or inside `ferry run`."""
    with open(HOOK) as f:
        hook = f.read()
    limit = str(case_limit or args.case_limit)
    res = RESOURCES.get(unit.split(".")[0])
    cmd = [args.python, "-c", hook, limit, "-v"] + (["-u", res] if res else []) + extra + [unit]
    if side == "ferry":
        cmd = [args.ferry, "run"] + shlex.split(args.ferry_opts) + ["--"] + cmd
    return cmd


# --- one run ------------------------------------------------------------------------------

def stop(proc):
    """SIGTERM to the run's leader (ferry forwards it and removes its sandbox), SIGKILL
    to its whole process group 10 s later."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_once(cmd, log_path, scratch, limit):
    """Runs cmd with its output into log_path; returns (exit code or None, seconds)."""
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=scratch,
                                env=dict(ENV, TMPDIR=scratch), start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stop(proc)
            code = None
        except BaseException:  # interrupted (SIGINT, SIGTERM): leave nothing behind
            stop(proc)
            raise
    return code, time.monotonic() - started


def parse_frames(data):
    """(outcomes by case id in run order, id of a case started and never ended)."""
    cases, open_case = {}, None
    for m in FRAME.finditer(data):
        try:
            rec = json.loads(m.group(1))
        except ValueError:
            continue
        if rec.get("ev") == "start":
            open_case = rec["id"]
        elif rec.get("ev") == "end":
            cases[rec["id"]] = {"outcome": rec["outcome"], "reason": rec.get("reason", ""),
                                "secs": rec.get("secs", 0)}
            if rec["id"] == open_case:
                open_case = None
    return cases, open_case


def stopped_as(code, data):
    """What a case left open by a run was: hung (past its time) or crashed."""
    return "hung" if code is None or b"Timeout (" in data else "crashed"


def summary_line(data):
    """regrtest's verdict on the run, with why it skipped a whole module if it did."""
    m = re.findall(rb"Tests result: ([^\n]*)", data)
    verdict = m[-1].decode(errors="replace").strip() if m else ""
    skip = re.search(rb"^\S+ skipped -- ([^\n]*)", data, re.M)
    return verdict + (f" (module skipped: {skip.group(1).decode(errors='replace')})"
                      if skip else "")


# --- a unit on one side, resumed after a hang or crash -------------------------------------

def run_unit(side, unit, args, logs, scratch):
    cases, runs, done = {}, [], []
    for attempt in range(RESUMES + 1):
        extra = []
        if done:
            ignore = os.path.join(scratch, f"ignore-{side}.txt")
            with open(ignore, "w") as f:
                f.write("\n".join(done) + "\n")
            extra = ["--ignorefile", ignore]
        log = os.path.join(logs, f"{unit}.{side}.{attempt}.log")
        code, secs = run_once(command(side, unit, args, extra), log, scratch, args.limit)
        with open(log, "rb") as f:
            data = f.read()
        got, open_case = parse_frames(data)
        cases.update(got)
        runs.append({"log": os.path.relpath(log, args.out), "exit": code,
                     "secs": round(secs, 1), "result": summary_line(data)})
        done += [c for c in got if "." in c and " " not in c]
        if open_case is None:
            break
        cases[open_case] = {"outcome": stopped_as(code, data),
                            "reason": f"the run ended in it (exit {code})", "secs": None}
        done.append(open_case)
        say(f"  {unit} {side}: {cases[open_case]['outcome']} in {open_case}; resuming")
    return {"cases": cases, "runs": runs}


def counts(cases):
    out = {}
    for c in cases.values():
        out[c["outcome"]] = out.get(c["outcome"], 0) + 1
    return out


# --- comparison and re-runs ------------------------------------------------------------------

def key(case):
    """What must be equal: the outcome, and for a skip its reason."""
    if case is None:
        return ("missing",)
    if case["outcome"] == "skipped":
        return ("skipped", case["reason"])
    return (case["outcome"],)


def differing(unit_result):
    n, f = unit_result["native"]["cases"], unit_result["ferry"]["cases"]
    return sorted(c for c in set(n) | set(f) if key(n.get(c)) != key(f.get(c)))


def match_pattern(case_id):
    """A regrtest --matchfile line selecting one case (a class fixture: its class)."""
    m = re.match(r"\w+ \(([\w.]+)\)$", case_id)
    return m.group(1) + ".*" if m else case_id


def rerun(unit, ids, args, logs, scratch):
    """Runs the differing cases of a unit alone, --reruns times per side; per case and
    side, the outcomes seen. A case hangs here after RERUN_CASE_LIMIT seconds at most:
    every case of these suites takes well under that when it does not hang."""
    seen = {c: {s: [] for s in SIDES} for c in ids}
    matchfile = os.path.join(scratch, "rerun-match.txt")
    with open(matchfile, "w") as f:
        f.write("\n".join(sorted({match_pattern(c) for c in ids})) + "\n")
    for i in range(args.reruns):
        for side in SIDES:
            log = os.path.join(logs, f"{unit}.{side}.rerun{i}.log")
            cmd = command(side, unit, args, ["--matchfile", matchfile],
                          min(args.case_limit, RERUN_CASE_LIMIT))
            code, _ = run_once(cmd, log, scratch, args.limit)
            with open(log, "rb") as f:
                data = f.read()
            got, open_case = parse_frames(data)
            for c in ids:
                case = got.get(c)
                if case is None and c == open_case:
                    case = {"outcome": stopped_as(code, data), "reason": ""}
                seen[c][side].append(" ".join(key(case)))
    return seen


# --- the known differences -----------------------------------------------------------------

def load_known(path):
    """(glob over case ids, class, note) rows of scripts/cpython-suites-known.tsv."""
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                sys.exit(f"cpython-suites: {path}: want 3 tab-separated fields: {line!r}")
            rows.append(tuple(p.strip() for p in parts))
    return rows


def explain(case_id, known):
    for pattern, cls, note in known:
        if fnmatch.fnmatchcase(case_id, pattern):
            return cls, note
    return "unexplained", ""


# --- the report ----------------------------------------------------------------------------

def describe(case):
    if case is None:
        return "missing"
    if case["outcome"] in ("ok", "expected-failure", "unexpected-success"):
        return case["outcome"]
    return f"{case['outcome']}: {case['reason']}" if case["reason"] else case["outcome"]


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def suite_rows(results):
    """Per suite: cases, identical, differ, and both sides' counts by outcome."""
    rows = {}
    for unit, r in results["units"].items():
        row = rows.setdefault(r["suite"], {"cases": 0, "identical": 0, "differ": 0,
                                           "native": {}, "ferry": {}, "secs": [0, 0]})
        ids = set(r["native"]["cases"]) | set(r["ferry"]["cases"])
        diff = len(r["diff"])
        row["cases"] += len(ids)
        row["differ"] += diff
        row["identical"] += len(ids) - diff
        for i, side in enumerate(SIDES):
            for k, v in counts(r[side]["cases"]).items():
                row[side][k] = row[side].get(k, 0) + v
            row["secs"][i] += sum(x["secs"] for x in r[side]["runs"])
    return rows


def outcome_counts(c):
    order = ["ok", "skipped", "fail", "error", "hung", "crashed", "expected-failure",
             "unexpected-success"]
    return " ".join(f"{k} {c[k]}" for k in order if c.get(k))


def render_table(results):
    lines = ["| suite | cases | identical | differ | native | ferry | seconds (native / ferry) |",
             "|---|---:|---:|---:|---|---|---|"]
    total = [0, 0, 0]
    for suite, r in suite_rows(results).items():
        total = [total[0] + r["cases"], total[1] + r["identical"], total[2] + r["differ"]]
        lines.append(f"| {suite} | {r['cases']} | {r['identical']} | {r['differ']} | "
                     f"{outcome_counts(r['native'])} | {outcome_counts(r['ferry'])} | "
                     f"{r['secs'][0]:.0f} / {r['secs'][1]:.0f} |")
    lines.append(f"| **all** | {total[0]} | {total[1]} | {total[2]} | | | |")
    return lines


def diff_rows(results, known):
    rows = []
    for unit, r in results["units"].items():
        for c in r["diff"]:
            cls, note = explain(c, known)
            re_n = r.get("reruns", {}).get(c, {})
            rows.append({"suite": r["suite"], "unit": unit, "case": c,
                         "native": describe(r["native"]["cases"].get(c)),
                         "ferry": describe(r["ferry"]["cases"].get(c)),
                         "rerun_native": tally(re_n.get("native", [])),
                         "rerun_ferry": tally(re_n.get("ferry", [])),
                         "class": cls, "note": note})
    return rows


def tally(outcomes):
    out = {}
    for o in outcomes:
        out[o] = out.get(o, 0) + 1
    return ", ".join(f"{k} ×{v}" for k, v in sorted(out.items())) or "—"


def run_line(opts):
    return f"`ferry run {opts} -- …`" if opts else "`ferry run -- …`, default options"


def render_report(results, known):
    m = results["meta"]
    lines = ["# CPython's network suites, natively and through ferry", "",
             f"Run {m['date']} on {m['machine']}; {m['python']}; ferry {m['ferry']} "
             f"({run_line(m['ferry_opts'])}); "
             f"a case is hung after {m['case_limit']:.0f} s; "
             f"{m['reruns']} re-runs per side of each differing case.", "",
             *render_table(results), ""]
    empty = [f"{u} ({r['native']['runs'][0]['result']})" for u, r in results["units"].items()
             if not r["native"]["cases"] and not r["ferry"]["cases"]]
    if empty:
        lines += ["No case ran on either side in: " + "; ".join(empty) + ".", ""]
    rows = diff_rows(results, known)
    if rows:
        by_class = {}
        for d in rows:
            by_class[d["class"]] = by_class.get(d["class"], 0) + 1
        lines += ["Differing cases by reason: " + ", ".join(
                      f"{k} {v}" for k, v in sorted(by_class.items())) + ".", "",
                  "## Differing cases", "",
                  "| case | native | ferry | re-runs native | re-runs ferry | reason |",
                  "|---|---|---|---|---|---|"]
        for d in rows:
            reason = d["class"] + (f": {d['note']}" if d["note"] else "")
            lines.append(f"| `{cell(d['case'])}` | {cell(d['native'])} | {cell(d['ferry'])} "
                         f"| {d['rerun_native']} | {d['rerun_ferry']} | {cell(reason)} |")
    else:
        lines.append("Every case has the same outcome natively and through ferry.")
    return "\n".join(lines) + "\n", rows


def write_csv(results, path, known):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["suite", "unit", "case", "native", "native_reason", "ferry",
                    "ferry_reason", "identical", "reruns_native", "reruns_ferry", "class"])
        for unit, r in results["units"].items():
            n, fe = r["native"]["cases"], r["ferry"]["cases"]
            for c in sorted(set(n) | set(fe)):
                a, b = n.get(c) or {}, fe.get(c) or {}
                re_c = r.get("reruns", {}).get(c, {})
                same = c not in r["diff"]
                w.writerow([r["suite"], unit, c, a.get("outcome", "missing"),
                            a.get("reason", ""), b.get("outcome", "missing"),
                            b.get("reason", ""), int(same),
                            " | ".join(re_c.get("native", [])),
                            " | ".join(re_c.get("ferry", [])),
                            "" if same else explain(c, known)[0]])


def write_outputs(results, out, known):
    report, rows = render_report(results, known)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    write_csv(results, os.path.join(out, "results.csv"), known)
    print(report)
    unexplained = [d["case"] for d in rows if d["class"] == "unexplained"]
    for c in unexplained:
        say(f"unexplained difference: {c}")
    return 1 if unexplained else 0


# --- main ----------------------------------------------------------------------------------

def meta(args):
    rev = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    py = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                        capture_output=True, text=True, env=ENV).stdout.strip()
    pkg = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libpython3.11-testsuite"],
                         capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.system()} {platform.release()}, {cpu}, "
                       f"{os.cpu_count()} CPUs",
            "python": f"{args.python} {py}, libpython3.11-testsuite {pkg or '?'}",
            "ferry": rev or "?", "ferry_opts": args.ferry_opts, "case_limit": args.case_limit,
            "reruns": args.reruns}


def check_setup(args):
    if os.geteuid() != 0:
        sys.exit("cpython-suites: must run as root (ferry run needs it here)")
    for path in (args.python, args.ferry):
        if not os.access(path, os.X_OK):
            sys.exit(f"cpython-suites: {path} not found (build: cargo build --release)")
    probe = subprocess.run([args.python, "-c", "import test.support.testresult, "
                            "test.test_socket"], capture_output=True, env=ENV)
    if probe.returncode != 0:
        sys.exit("cpython-suites: CPython's test package is missing "
                 "(apt-get install libpython3.11-testsuite; scripts/install-deps.sh)")


def run_all(args, known):
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    # The sandbox's root is an unprivileged host identity: it must be able to write the
    # scratch directory (the tests' temporary files and working directory).
    scratch = tempfile.mkdtemp(prefix="ferry-cpython-")
    os.chmod(scratch, 0o1777)
    results = {"meta": meta(args), "units": {}}
    units = units_of(args.suites.split(","), args.python, args.split_asyncio)
    try:
        for i, (suite, unit) in enumerate(units, 1):
            r = {"suite": suite}
            for side in SIDES:
                r[side] = run_unit(side, unit, args, logs, scratch)
                say(f"[{i}/{len(units)}] {unit} {side}: {len(r[side]['cases'])} cases "
                    f"({outcome_counts(counts(r[side]['cases']))}) in "
                    f"{sum(x['secs'] for x in r[side]['runs']):.0f} s")
            r["diff"] = differing(r)
            # Identity and environment differences follow from the set-up: not re-run.
            again = [c for c in r["diff"] if explain(c, known)[0] not in SETTLED]
            if again and args.reruns > 0:
                say(f"  {len(r['diff'])} differing, re-running {len(again)} "
                    f"{args.reruns}× per side")
                r["reruns"] = rerun(unit, again, args, logs, scratch)
            results["units"][unit] = r
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv):
    args = parse_args(argv)
    # A shell's background job starts with SIGINT and SIGQUIT ignored, and a program
    # inherits that: CPython then has no KeyboardInterrupt on SIGINT, and asyncio's
    # runner tests that interrupt themselves spin until they run out of memory.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("cpython-suites: terminated"))
    args.out = os.path.abspath(args.out)
    known = load_known(args.known)
    if args.report_only:
        with open(os.path.join(args.out, "results.json")) as f:
            return write_outputs(json.load(f), args.out, known)
    check_setup(args)
    return write_outputs(run_all(args, known), args.out, known)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
