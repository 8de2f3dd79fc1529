#!/usr/bin/env python3
"""Soak load for scripts/soak.sh (standard library only): SESSIONS concurrent chat sessions of mixed modes against
the OpenAI-compatible API of a running `easd up`, for DURATION seconds, loopback only. Each session sends one request
at a time (greedy, its own GSM8K development question each time), its mode fixed by its index (modes in turn).

Writes into --out: requests.csv (one line per finished request), rss.csv (resident memory of every named process
and of this driver every --sample-s), minutes.md (per minute: completed, errors by status, p50/p99 latency, tokens,
RSS at the minute's end) and summary.json; prints the minutes table. Exits when the duration is over and every
session's last request has finished or hit --request-timeout-s: never later than duration + request timeout.
"""
import argparse
import csv
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

PROMPT = (
    "Solve the following math problem step by step. End your response with a line of the form "
    '"The answer is N." where N is the final number.\n\nQuestion: {question}'
)


def percentile(sorted_values, p):
    """numpy's default (linear interpolation between closest ranks); None when empty."""
    if not sorted_values:
        return None
    rank = p / 100 * (len(sorted_values) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def loopback_only(url):
    host = urllib.parse.urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing {url}: the soak sends traffic to loopback only")


def request_json(url, body, timeout):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="http://127.0.0.1:PORT (the HTTP API of easd up)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration-s", type=float, default=600)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--modes", default="target,sd,easd")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--data", required=True)
    ap.add_argument("--first-line", type=int, default=2000, help="0-based line of the first question")
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--request-timeout-s", type=float, default=300)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--pid", action="append", default=[], help="NAME=PID whose RSS to sample (repeatable)")
    args = ap.parse_args()
    loopback_only(args.url)
    os.makedirs(args.out, exist_ok=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    pids = [(name, int(pid)) for name, pid in (p.split("=", 1) for p in args.pid)]
    pids.append(("load-driver", os.getpid()))
    with open(args.data) as f:
        lines = f.read().splitlines()[args.first_line : args.first_line + args.questions]
    questions = [json.loads(line)["question"] for line in lines if line.strip()]
    if not questions:
        raise SystemExit(f"no questions at line {args.first_line} of {args.data}")
    _, models = request_json(args.url + "/v1/models", None, 30)
    model = models["data"][0]["id"]

    start = time.monotonic()
    end = start + args.duration_s
    results, rss, lock = [], [], threading.Lock()
    error_examples = {}  # status -> the first response body (or exception) seen with it
    stop_sampling = threading.Event()

    def sample():
        while True:
            t = time.monotonic() - start
            with lock:
                rss.extend((t, name, rss_mib(pid)) for name, pid in pids)
            if stop_sampling.wait(args.sample_s):
                break
        t = time.monotonic() - start
        with lock:
            rss.extend((t, name, rss_mib(pid)) for name, pid in pids)

    def session(i):
        mode = modes[i % len(modes)]
        j = 0
        while time.monotonic() < end:
            question = questions[(i + j * args.sessions) % len(questions)]
            j += 1
            body = {
                "model": model,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "messages": [{"role": "user", "content": PROMPT.format(question=question)}],
                "easd": {"mode": mode},
            }
            t0 = time.monotonic()
            status, tokens, example = "200", 0, ""
            try:
                _, answer = request_json(args.url + "/v1/chat/completions", body, args.request_timeout_s)
                tokens = answer.get("usage", {}).get("completion_tokens", 0)
            except urllib.error.HTTPError as e:
                status, example = str(e.code), e.read()[:300].decode(errors="replace")
            except TimeoutError as e:
                status, example = "timeout", str(e)
            except (urllib.error.URLError, OSError) as e:
                status, example = ("timeout" if "timed out" in str(e) else "connection"), str(e)
            t1 = time.monotonic()
            with lock:
                results.append((t0 - start, t1 - start, i, mode, status, t1 - t0, tokens))
                if status != "200":
                    error_examples.setdefault(status, f"{mode}: {example}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(args.sessions)]
    for t in threads:
        t.start()
    deadline = end + args.request_timeout_s + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    unfinished = sum(t.is_alive() for t in threads)
    stop_sampling.set()
    sampler.join(10)
    with lock:
        results_done, rss_done = sorted(results), sorted(rss, key=lambda r: (r[0], r[1]))

    with open(os.path.join(args.out, "requests.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "end_s", "session", "mode", "status", "latency_s", "completion_tokens"])
        w.writerows([f"{a:.3f}", f"{b:.3f}", s, m, st, f"{lat:.3f}", tok] for a, b, s, m, st, lat, tok in results_done)
    with open(os.path.join(args.out, "rss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "process", "rss_mib"])
        w.writerows([f"{t:.1f}", name, "" if v is None else f"{v:.1f}"] for t, name, v in rss_done)

    names = [name for name, _ in pids]
    minutes = max(1, int((args.duration_s + 59) // 60))

    def rss_at(name, t):
        """The last sample of `name` at or before t (the first one if none)."""
        values = [(ts, v) for ts, n, v in rss_done if n == name and v is not None]
        before = [v for ts, v in values if ts <= t + 1e-6]
        return before[-1] if before else (values[0][1] if values else None)

    rows = []
    for m in range(minutes):
        lo, hi = 60 * m, min(60 * (m + 1), args.duration_s) if m == minutes - 1 else 60 * (m + 1)
        # Requests are counted in the minute they finished; the last minute takes the stragglers too.
        done = [r for r in results_done if lo <= r[1] < hi or (m == minutes - 1 and r[1] >= hi)]
        ok = sorted(r[5] for r in done if r[4] == "200")
        errors = {}
        for r in done:
            if r[4] != "200":
                errors[r[4]] = errors.get(r[4], 0) + 1
        rows.append(
            {
                "minute": m + 1,
                "completed": len(ok),
                "by_mode": {mode: sum(1 for r in done if r[3] == mode and r[4] == "200") for mode in modes},
                "errors": errors,
                "p50_s": percentile(ok, 50),
                "p99_s": percentile(ok, 99),
                "tokens": sum(r[6] for r in done if r[4] == "200"),
                "rss_mib": {name: rss_at(name, hi) for name in names},
            }
        )

    def fmt(v, digits=2):
        return "–" if v is None else f"{v:.{digits}f}"

    table = [
        "| minute | completed | " + " / ".join(modes) + " | errors by status | p50 latency s | p99 latency s | tokens | "
        + " | ".join(f"RSS {n} MiB" for n in names) + " |",
        "|---:|---:|---|---|---:|---:|---:|" + "---:|" * len(names),
    ]
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "–"
        table.append(
            f"| {r['minute']} | {r['completed']} | " + " / ".join(str(r["by_mode"][m]) for m in modes)
            + f" | {errors} | {fmt(r['p50_s'])} | {fmt(r['p99_s'])} | {r['tokens']} | "
            + " | ".join(fmt(r["rss_mib"][n], 1) for n in names) + " |"
        )

    # Levelled off: the last minute's growth is at most max(8 MiB, 1 % of the RSS) — compared with the first's. Runs
    # shorter than three minutes cannot tell a warm-up from a trend.
    levels = {}
    for name in names:
        if args.duration_s < 180:
            levels[name] = {"verdict": "run too short to tell (< 3 minutes)"}
            continue
        first, after_first = rss_at(name, 0), rss_at(name, 60)
        last_end = rss_at(name, args.duration_s)
        last_start = rss_at(name, max(0.0, args.duration_s - 60))
        if None in (first, after_first, last_end, last_start):
            levels[name] = {"verdict": "no samples"}
            continue
        growth_first, growth_last = after_first - first, last_end - last_start
        levelled = growth_last <= max(8.0, 0.01 * last_end)
        levels[name] = {
            "start_mib": first,
            "end_mib": last_end,
            "first_minute_growth_mib": growth_first,
            "last_minute_growth_mib": growth_last,
            "verdict": "levelled off" if levelled else "still growing",
        }

    total_ok = sum(r["completed"] for r in rows)
    all_errors = {}
    for r in rows:
        for k, v in r["errors"].items():
            all_errors[k] = all_errors.get(k, 0) + v
    summary = {
        "url": args.url,
        "model": model,
        "sessions": args.sessions,
        "modes": modes,
        "duration_s": args.duration_s,
        "max_tokens": args.max_tokens,
        "completed": total_ok,
        "errors": all_errors,
        "error_examples": error_examples,
        "unfinished_sessions": unfinished,
        "minutes": rows,
        "rss": levels,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(args.out, "minutes.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))
    print(f"\ncompleted {total_ok}, errors {all_errors or 'none'}, sessions still in a request at the end: {unfinished}")
    for status, example in sorted(error_examples.items()):
        print(f"first {status}: {example}")
    for name, lv in levels.items():
        if "start_mib" in lv:
            print(
                f"RSS {name}: {lv['start_mib']:.1f} -> {lv['end_mib']:.1f} MiB; first minute +{lv['first_minute_growth_mib']:.1f}, "
                f"last minute {lv['last_minute_growth_mib']:+.1f}: {lv['verdict']}"
            )
        else:
            start_v, end_v = rss_at(name, 0), rss_at(name, args.duration_s)
            span = "" if None in (start_v, end_v) else f"{start_v:.1f} -> {end_v:.1f} MiB; "
            print(f"RSS {name}: {span}{lv['verdict']}")


if __name__ == "__main__":
    main()
