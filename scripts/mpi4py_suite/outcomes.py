"""From the ranks' records of one test file to one outcome per test.

Per rank a test is: pass, fail, error, skip (what unittest reported; an
expected failure is a pass, an unexpected success a failure), crashed or
hung (begun, never ended, and the job died or ran past its time), or not_run
(never begun: a crash or hang came first, or its class's setUpClass failed
-- that one is an error). Across ranks the worst wins, in the order
hung, crashed, error, fail, not_run, pass, skip: a test failing on any rank
fails, and a test is skipped only if every rank skipped it.

A job that died or hung after every test ended (in MPI_Finalize, say) gets
one more entry, "<file> (process exit)", crashed or hung, so that a clean
table never hides a dead job.
"""
import json
import os
import re

KINDS = ["passed", "failed", "errors", "crashed", "hung", "skipped", "not_run"]
OUTCOME_KIND = {
    "pass": "passed",
    "fail": "failed",
    "error": "errors",
    "crashed": "crashed",
    "hung": "hung",
    "skip": "skipped",
    "not_run": "not_run",
}
WORST_FIRST = ["hung", "crashed", "error", "fail", "not_run", "pass", "skip"]


class Rank:
    def __init__(self):
        self.pid = None
        self.ids = None
        self.begun = []
        self.ended = {}
        self.errors = []
        self.done = False


def read_rank(path):
    rank = Rank()
    if not os.path.exists(path):
        return rank
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            kind = ev.get("ev")
            if kind == "start":
                rank.pid = ev.get("pid")
            elif kind == "tests":
                rank.ids = ev.get("ids", [])
            elif kind == "begin":
                rank.begun.append(ev["id"])
            elif kind == "end":
                rank.ended[ev["id"]] = (ev.get("outcome", "error"), ev.get("detail", ""))
            elif kind == "error":
                rank.errors.append((ev.get("id", "?"), ev.get("detail", "")))
            elif kind == "done":
                rank.done = True
    return rank


def read_ranks(record_dir, np):
    return [read_rank(os.path.join(record_dir, f"rank{r}.jsonl")) for r in range(np)]


def holder_scope(holder_id):
    """'setUpClass (test_x.TestY)' -> 'test_x.TestY.'; None if not of that form."""
    m = re.match(r"^\w+ \(([\w.]+)\)$", holder_id)
    return m.group(1) + "." if m else None


def rank_outcome(rank, test, died, timed_out):
    if test in rank.ended:
        return rank.ended[test]
    if test in rank.begun:
        return ("hung" if timed_out else "crashed", "begun, never ended")
    for holder, detail in rank.errors:
        scope = holder_scope(holder)
        if scope and test.startswith(scope):
            return ("error", f"{holder}\n{detail}")
    if died or not rank.done:
        return ("not_run", "the job ended before it")
    return ("not_run", "loaded, never started")


def worst(outcomes):
    seen = {o for o, _ in outcomes}
    if seen == {"skip"}:
        return "skip"
    for o in WORST_FIRST:
        if o in seen and o != "skip":
            return o
    return "not_run"


class FileOutcome:
    def __init__(self, name):
        self.name = name
        self.tests = {}  # id -> outcome
        self.details = {}  # id -> first detail of a bad outcome
        self.status = "ok"
        self.seconds = 0.0

    def counts(self):
        c = dict.fromkeys(KINDS, 0)
        for o in self.tests.values():
            c[OUTCOME_KIND[o]] += 1
        return c


def classify(name, ranks, rc, timed_out, seconds, job_note=""):
    """One file's FileOutcome from its ranks' records and its job's end."""
    out = FileOutcome(name)
    out.seconds = seconds
    died = timed_out or rc != 0 or not all(r.done for r in ranks)
    ids = []
    for r in ranks:
        for i in (r.ids or []):
            if i not in ids:
                ids.append(i)
    for r in ranks:
        for i in r.begun:
            if i not in ids:
                ids.append(i)
    for test in ids:
        per_rank = [rank_outcome(r, test, died, timed_out) for r in ranks]
        o = worst(per_rank)
        out.tests[test] = o
        if o != "pass":
            for (ro, detail), rnk in zip(per_rank, range(len(per_rank))):
                if ro == o:
                    out.details[test] = f"rank {rnk}: {detail}"
                    break
    for r_index, r in enumerate(ranks):
        for holder, detail in r.errors:
            if holder_scope(holder) is None and holder not in out.tests:
                # An error outside any test and outside a class (the program itself).
                out.tests[f"{name} {holder}"] = "error"
                out.details[f"{name} {holder}"] = f"rank {r_index}: {detail}"
    unexplained = died and not any(o in ("crashed", "hung") for o in out.tests.values())
    if unexplained:
        key = f"{name} (process exit)"
        out.tests[key] = "hung" if timed_out else "crashed"
        out.details[key] = job_note or f"job exit status {rc}"
    if timed_out:
        out.status = "hung"
    elif died:
        out.status = "crashed"
    elif any(o in ("fail", "error", "not_run") for o in out.tests.values()):
        out.status = "failed"
    if job_note and out.status in ("hung", "crashed"):
        out.status += f" ({job_note})"
    return out


def not_started(name, why):
    out = FileOutcome(name)
    key = f"{name} (not started)"
    out.tests[key] = "not_run"
    out.details[key] = why
    out.status = "not started"
    return out


def totals(files):
    t = dict.fromkeys(KINDS, 0)
    for f in files:
        for k, v in f.counts().items():
            t[k] += v
    t["tests"] = sum(len(f.tests) for f in files)
    return t


def table(files, title):
    lines = [f"## {title}", "", "| file | status | tests | " + " | ".join(KINDS) + " | s |",
             "|---|---|---:|" + "---:|" * len(KINDS) + "---:|"]
    for f in files:
        c = f.counts()
        lines.append(f"| {f.name} | {f.status} | {len(f.tests)} | "
                     + " | ".join(str(c[k]) for k in KINDS) + f" | {f.seconds:.1f} |")
    t = totals(files)
    lines.append(f"| **total** | | {t['tests']} | " + " | ".join(str(t[k]) for k in KINDS)
                 + f" | {sum(f.seconds for f in files):.1f} |")
    bad = [(f.name, i, o, f.details.get(i, "")) for f in files for i, o in f.tests.items()
           if o not in ("pass", "skip")]
    if bad:
        lines += ["", "### not passed", ""]
        for _, i, o, detail in bad:
            first = detail.strip().splitlines()[-1] if detail.strip() else ""
            lines.append(f"- `{i}`: {o}" + (f" -- {first[:200]}" if first else ""))
    skipped = [i for f in files for i, o in f.tests.items() if o == "skip"]
    if skipped:
        lines += ["", f"### skipped ({len(skipped)})", ""]
        for f in files:
            for i, o in f.tests.items():
                if o == "skip":
                    reason = f.details.get(i, "").split(": ", 1)[-1].strip()
                    lines.append(f"- `{i}`" + (f": {reason[:120]}" if reason else ""))
    return "\n".join(lines) + "\n"
