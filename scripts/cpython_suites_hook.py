# Runs CPython's regression-test driver (`python3 -m test`) with one addition: every test
# case's start and outcome is written to the process's original standard output as one
# framed line, so that scripts/cpython-suites.py can read per-case outcomes even from a
# run it had to kill (a hung case is the last one started and never ended).
#
# Not run directly: scripts/cpython-suites.py passes this file's text with `python3 -c`
# (the sandbox may not be able to read the checkout), then the seconds one case may
# take, then regrtest's arguments. A case past its time has every thread's traceback
# dumped and ends the process (faulthandler; the output says "Timeout ("), so that a
# hung case costs its own limit, not the whole suite's.
# A frame is "\x1eCASE " + JSON + "\x1f": JSON escapes both control characters, so a
# frame is found even when a test's own output shares its line.
import faulthandler
import json
import os
import resource
import sys
import time

from test.support import testresult

_OUT = os.dup(1)
_AS_LIMIT = 4 << 30
_RANK = {"ok": 0, "skipped": 1, "expected-failure": 1, "unexpected-success": 2,
         "fail": 3, "error": 4}


def _emit(record):
    data = "\x1eCASE " + json.dumps(record, ensure_ascii=True) + "\x1f\n"
    try:
        os.write(_OUT, data.encode())
    except OSError:
        pass


def _case_id(test):
    try:
        return test.id()
    except Exception:  # an _ErrorHolder (setUpClass, setUpModule) has no usable id
        return str(test)


def _message(err):
    if not err:
        return ""
    kind, value = err[0], err[1]
    name = getattr(kind, "__name__", str(kind))
    text = str(value).strip().splitlines()
    return (name + ": " + (text[0] if text else ""))[:300]


class _Case:
    """What one case has reported so far: its worst outcome and the first reason."""

    def __init__(self):
        self.outcome = "ok"
        self.reason = ""
        self.started = time.monotonic()

    def note(self, outcome, reason=""):
        if _RANK[outcome] > _RANK[self.outcome]:
            self.outcome, self.reason = outcome, reason
        elif outcome == "skipped" and self.outcome == "ok" and not self.reason:
            self.outcome, self.reason = outcome, reason


def _install(case_limit):
    cls = testresult.RegressionTestResult
    cases = {}

    def record(test, outcome, reason=""):
        test = getattr(test, "test_case", test)  # a subtest counts for its case
        cid = _case_id(test)
        case = cases.get(cid)
        if case is None:  # a class or module fixture: no startTest/stopTest
            _emit({"ev": "end", "id": cid, "outcome": outcome, "reason": reason, "secs": 0})
            return
        case.note(outcome, reason)

    def wrap(name, body):
        orig = getattr(cls, name)

        def method(self, *args):
            body(*args)
            return orig(self, *args)

        setattr(cls, name, method)

    def start(test):
        cid = _case_id(test)
        cases[cid] = _Case()
        _emit({"ev": "start", "id": cid})
        faulthandler.dump_traceback_later(case_limit, exit=True)

    def stop(test):
        faulthandler.cancel_dump_traceback_later()
        cid = _case_id(test)
        case = cases.pop(cid, None)
        if case is not None:
            _emit({"ev": "end", "id": cid, "outcome": case.outcome, "reason": case.reason,
                   "secs": round(time.monotonic() - case.started, 3)})

    def subtest(test, sub, err):
        if err is None:
            return
        failed = issubclass(err[0], test.failureException)
        record(test, "fail" if failed else "error", f"{sub._subDescription()}: {_message(err)}")

    wrap("startTest", start)
    wrap("stopTest", stop)
    wrap("addSuccess", lambda t: None)
    wrap("addFailure", lambda t, e: record(t, "fail", _message(e)))
    wrap("addError", lambda t, e: record(t, "error", _message(e)))
    wrap("addSkip", lambda t, r: record(t, "skipped", str(r)[:300]))
    wrap("addExpectedFailure", lambda t, e: record(t, "expected-failure"))
    wrap("addUnexpectedSuccess", lambda t: record(t, "unexpected-success"))
    wrap("addSubTest", subtest)


_install(float(sys.argv.pop(1)))
# A runaway case fails with MemoryError instead of taking the machine's memory (the
# tests' own child processes inherit the limit).
resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))
sys.argv[0] = "-m test"
from test.libregrtest import main  # noqa: E402  (after the hook is in place)

main()
