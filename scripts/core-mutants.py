#!/usr/bin/env python3
"""Breaks each ordering and readiness rule of the server core on purpose, one at a time,
and runs the in-process harness (crates/server/tests/core.rs) against the broken build:
every break must be caught by a test. Restores the source after each. Not part of CI
(a developer's check when a rule or its test changes): `python3 scripts/core-mutants.py
[M1 M2 ...]`. A break whose text no longer matches the source stops the run: update it
with the code."""
import os
import re
import subprocess
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
muts = [
 ("M1 pair_input ignores queued sends", "crates/server/src/FILE", "            if !s.txq.is_empty() {\n                s.pair_in_wait = true;\n                return;\n            }\n            let n = match", "            let n = match"),
 ("M2 pair_input ignores records still in a ring", "crates/server/src/FILE", "if self.channels.rings_pending() {", "if false && self.channels.rings_pending() {"),
 ("M3 BufReturn does not drain room waiters", "crates/server/src/FILE", "if c.kind == CmpKind::BufReturn as u16 && !chan.room_wait.is_empty() {", "if c.kind == CmpKind::BufReturn as u16 && !chan.room_wait.is_empty() && false {"),
 ("M4 WantRoom never drains at once", "crates/server/src/FILE", "if chan.returns != seen {", "if false {"),
 ("M5 filler_due ignored at the mark", "crates/server/src/FILE", "if std::mem::take(&mut s.filler_due) && marked {", "if std::mem::take(&mut s.filler_due) && marked && false {"),
 ("M6 accept never takes the token back", "crates/server/src/FILE", "r.c = self.drain_if_empty(listener);", "r.c = 0;"),
 ("M7 failed non-blocking connect keeps its pair", "crates/server/src/FILE", "if filled && err != 0 && !reported {", "if false {"),
 ("M8 failed blocking connect not dissolved", "crates/server/src/FILE", "        } else if reported {\n", "        } else if false {\n"),
 ("M9 hang-up mirrored before the end of stream", "crates/server/src/FILE", "self.hup_due && self.pair_end == PairEnd::Eof && !self.app_closed", "self.hup_due && self.pair_end != PairEnd::Hup && !self.app_closed"),
 ("M10 stream error reported more than once", "crates/server/src/FILE", "Some(match std::mem::take(&mut s.so_error) {", "Some(match s.so_error {"),
 ("M11 an ended stream's token taken back", "crates/server/src/FILE", "let short = s.is_stream() && placed < room && !s.rx_ending;", "let short = s.is_stream() && placed < room;"),
 ("M12 a read stopped at the urgent mark counts as draining", "crates/server/src/FILE", "let drained = !s.rx_bulk && n < RX_SCRATCH && !s.rx_ending && !s.oob_due;", "let drained = !s.rx_bulk && n < RX_SCRATCH && !s.rx_ending;"),
 ("M13 no back-pressure", "crates/server/src/FILE", "if ch.backlog.len() >= BACKLOG_HIGH {", "if false {"),
 ("M14 partial send counted as whole", "crates/server/src/FILE", "if n < left && stream {", "if false {"),
 ("M16 the end mirrored before the token", "crates/server/src/FILE", "        if (readable || published) && io.send(s.pair.as_fd(), &[1]).is_ok() {", "        if rev & (libc::POLLRDHUP | libc::POLLHUP) != 0 && !s.listening() {\n            s.mirror_eof(io);\n        }\n        if (readable || published) && io.send(s.pair.as_fd(), &[1]).is_ok() {"),
 ("M15 hang-up mirrored without flushing the channel", "crates/server/src/FILE", "        if let Some(c) = self.chan_mut(ch) {\n            c.flush();\n        }\n        let Some(s) = self.socks.get_mut(&id) else {\n            return;\n        };\n        s.pair_end = PairEnd::Hup;", "        let Some(s) = self.socks.get_mut(&id) else {\n            return;\n        };\n        s.pair_end = PairEnd::Hup;"),
]
only = sys.argv[1:] 
for name, path, old, new in muts:
    if only and name.split()[0] not in only: continue
    if path.endswith("FILE"):
        # The break's text names its file: the one source of the crate that has it.
        import glob
        hits = [f for f in glob.glob("crates/server/src/*.rs") if old in open(f).read()]
        assert len(hits) == 1, (name, hits)
        path = hits[0]
    src = open(path).read()
    assert src.count(old) == 1, (name, src.count(old))
    open(path, 'w').write(src.replace(old, new))
    try:
        r = subprocess.run(["cargo","test","-q","-p","ferry-server","--test","core"], capture_output=True, text=True)
        failed = re.findall(r"^    (\S+)$", r.stdout, re.M)
        print(f"{name}: {'CAUGHT by ' + ', '.join(failed) if failed else 'NOT CAUGHT'}", flush=True)
    finally:
        open(path, 'w').write(src)
