#!/usr/bin/env python3
"""An offline model of the pipelined loop's block policies for greedy `sd` (issue 15), to choose what to build.

Greedy `sd` accepts a drafted token exactly where the draft's argmax, given the correct prefix, is the target's
greedy token — whatever the blocks are. So one pass of `draft_agreement` (which positions agree, and the draft's
entropy there) plus the two machines' costs is enough to replay any block policy in simulated time:

  cargo run --release -p easd-model --example draft_agreement -- draft target 256 "$QUESTION" … > agree.jsonl
  scripts/pipeline-model.py agree.jsonl --draft-ms 22 --verify-ms 58,62,71,83,97,112,121,138,155

Costs: the draft's one-token forward (and two-row, after a rollback), the verifier's forward by rows (1, 2, …), and
one-way latencies. Measure them with `easd bench model --threads 1 --ks 1,2,…` pinned to each core; the defaults are
the AVX-512 AMD kind's (2026-12-05) with the verifier's raised 20 %, as its forwards ran inside the loop. The model
leaves out prefill and per-call work other than these latencies, so its ratios run above measured ones; use it to rank
policies, not to predict a figure.
"""
import argparse
import json


def accepted_run(agree, p, n):
    a = 0
    while a < n and p + a < len(agree) and agree[p + a]:
        a += 1
    return a


class Costs:
    def __init__(self, args):
        self.d1, self.d2 = args.draft_ms, args.draft_ms * args.two_row_factor
        self.v = [float(x) for x in args.verify_ms.split(",")]
        self.req, self.tok, self.reply = args.request_ms, args.token_ms, args.reply_ms

    def verify(self, rows):
        if rows <= len(self.v):
            return self.v[rows - 1]
        slope = self.v[-1] - self.v[-2]
        return self.v[-1] + slope * (rows - len(self.v))


def sequential(q, k, c):
    agree = q["agree"]
    t, p = 0.0, 0
    while p < len(agree):
        n = min(k, len(agree) - p)
        t += c.req + c.d2 + (n - 1) * c.d1 + c.tok + c.req + c.verify(n + 1) + c.reply
        p += accepted_run(agree, p, n) + 1
    return t


def pipelined(q, floor, max_k, grow_entropy, reuse, c):
    """The loop of coordinator/generation.rs with flexible blocks: an empty first block, then each kept block takes
    what the draft made during the verify (at least `floor`; past it only sure tokens); a dropped pre-draft restarts
    the draft from the corrected prefix. `reuse`: the forward running when a pre-draft is cut short draws the next
    pre-draft's first token (the worker keeps it)."""
    agree, entropy = q["agree"], q["draft_entropy"]
    total = len(agree)
    t, p, n, draft_free, ready = 0.0, 0, 0, 0.0, None
    while p < total:
        verified = t + c.req + c.verify(n + 1) + c.reply
        room = max(total - p - n - 1, 0)
        least, most = min(floor, room), min(max_k, room)
        accepted = accepted_run(agree, p, n)
        if least > 0:
            count = most + 1
            start = max(t + c.req, draft_free if ready is None else ready)
            done = [start + c.d1 * (i + (0 if ready is not None else 1)) for i in range(count)]
            ready = None
            arrived = [x + c.tok for x in done]
            if accepted == n and p + n < total and agree[p + n]:
                have = sum(1 for a in arrived if a <= verified)
                if have >= least + 1:
                    t_next, got = verified, have
                else:
                    t_next, got = arrived[least], least + 1
                if got < count:
                    # The close reaches the draft a request later; the forward running then completes.
                    stop = t_next + c.req
                    draft_free = next((x for x in done if x >= stop), done[-1])
                    in_flight = done.index(draft_free)
                else:
                    draft_free, in_flight = done[-1], None
                block = least
                while block < got - 1 and p + n + 1 + block < total and entropy[p + n + 1 + block] <= grow_entropy:
                    block += 1
                if reuse and in_flight == got and block == got - 1:
                    ready = draft_free
                p, n, t = p + n + 1, block, t_next
                continue
            draft_free = next((x for x in done if x >= verified + c.req), done[-1])
        p += accepted + 1
        if p >= total:
            return verified
        n = min(floor, total - p)
        start = max(verified + c.req, draft_free)
        draft_free = start + c.d2 + (n - 1) * c.d1
        t = draft_free + c.tok
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("agreement", help="draft_agreement output (JSON lines); the first line is reported apart")
    ap.add_argument("--draft-ms", type=float, default=22.0)
    ap.add_argument("--two-row-factor", type=float, default=1.13)
    ap.add_argument("--verify-ms", default="58,62,71,83,97,112,121,138,155")
    ap.add_argument("--request-ms", type=float, default=3.0)
    ap.add_argument("--token-ms", type=float, default=2.0)
    ap.add_argument("--reply-ms", type=float, default=6.0)
    ap.add_argument("-k", type=int, default=4)
    args = ap.parse_args()
    c = Costs(args)
    questions = [json.loads(line) for line in open(args.agreement)]
    for name, group in (("first", questions[:1]), ("rest", questions[1:])):
        if not group:
            continue
        tokens = sum(len(q["agree"]) for q in group)
        seq = sum(sequential(q, args.k, c) for q in group)
        print(f"{name}: {tokens} tokens, sequential k {args.k}: {tokens / seq * 1000:.1f} tok/s")
        for reuse in (False, True):
            cells = []
            for floor in range(1, args.k + 1):
                ms = sum(pipelined(q, floor, 8, 0.5, reuse, c) for q in group)
                cells.append(f"floor {floor}: {seq / ms:.2f}x")
            print(f"  pipelined, {'kept draws' if reuse else 'no reuse  '}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
