#!/usr/bin/env python3
"""Long prompts on the real pair with `easd up` defaults: time to first token against our own prefill benchmark.

Starts `easd up` (every default; RUST_LOG=info into OUT/up.log), sends few-shot GSM8K prompts of about the asked
lengths (train lines 7100 on, worked answers) and one long code file, over gRPC (`easd ask --coordinator`) and over
the OpenAI API (streamed), then stops it and runs `easd bench model --prompt-tokens N` for the draft and the target
(never beside the server). Prints one markdown table: prompt tokens, time to first token (the server's), the draft's
and the target's prefill in the same run (the workers' `prefilled` log lines), the two models' prefill benchmark, the
retries and failovers the coordinator logged, and the process's peak RSS.

    EASD=target/release/easd python3 scripts/bench-long-prompts.py [--lengths 1000,2000,4000,8000,16000]
        [--apis grpc,openai] [--code 4000] [--twelve-shot] [--max-tokens 64] [--out DIR] [--no-bench-model]

Bounded: one request at a time, loopback only, each with a client timeout; the server is stopped at the end.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k", "train.jsonl")
# Characters per token of GSM8K text and of Rust code with the Qwen2.5 tokenizer: a first guess, corrected by the
# server's own count (`sized`); the table reports each prompt's real token count.
CHARS_PER_TOKEN = {"gsm8k": 3.0, "code": 3.3}
QUESTION_LINE = 7099


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gsm8k_lines():
    with open(GSM8K) as f:
        return [json.loads(line) for line in f]


def few_shot(problems, chars=None, shots=None):
    """A system prompt of worked GSM8K examples (train lines 7100 on): `shots` of them, or about `chars` characters."""
    parts, size, i = [], 0, 7100
    while (shots is not None and len(parts) < shots) or (chars is not None and size < chars):
        p = problems[i % len(problems)]
        text = f"Question: {p['question']}\nAnswer: {p['answer']}\n\n"
        parts.append(text)
        size += len(text)
        i += 1
    system = "Solve grade-school math problems step by step, as in these worked examples.\n\n" + "".join(parts)
    return system, problems[QUESTION_LINE]["question"]


def code_file(chars):
    """About `chars` characters of this repository's Rust sources, and a question about them."""
    sources = []
    for d in ["crates/easd-server/src", "crates/easd-server/src/coordinator", "crates/easd-model/src"]:
        for name in sorted(os.listdir(os.path.join(ROOT, d))):
            if name.endswith(".rs"):
                with open(os.path.join(ROOT, d, name)) as f:
                    sources.append(f"// file: {d}/{name}\n" + f.read())
    text = "\n".join(sources)[: int(chars)]
    return "You review Rust code. Here is the code:\n\n" + text, "Which function decides how many tokens each forward feeds?"


def ask_grpc(easd, url, system, question, max_tokens):
    """gRPC through `easd ask` (one user message holding the system text and the question)."""
    text = system + "\n\n" + question
    started = time.time()
    out = subprocess.run(
        [easd, "ask", "--coordinator", url, "--json", "--max-tokens", str(max_tokens), text],
        capture_output=True, text=True, timeout=3600,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-400:], "wall_s": time.time() - started}
    answer = json.loads(out.stdout)
    return {
        "prompt_tokens": answer.get("prompt_tokens"),
        "ttft_s": answer.get("time_to_first_token_s"),
        "generated": answer.get("generated_tokens"),
        "failovers": answer.get("failovers"),
        "wall_s": time.time() - started,
    }


def ask_openai(http, system, question, max_tokens):
    """The OpenAI API, streamed: system + user messages."""
    with urllib.request.urlopen(f"{http}/v1/models", timeout=30) as resp:
        model = json.load(resp)["data"][0]["id"]
    body = {
        "model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    req = urllib.request.Request(f"{http}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    started, first, summary, usage = time.time(), None, {}, {}
    try:
        with urllib.request.urlopen(req, timeout=3600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    first = time.time() - started
                summary = chunk.get("easd") or summary
                usage = chunk.get("usage") or usage
    except urllib.error.HTTPError as e:
        return {"error": f"HTTP {e.code}: {e.read().decode()[-400:]}", "wall_s": time.time() - started}
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "ttft_s": summary.get("time_to_first_token_s", first),
        "generated": usage.get("completion_tokens"),
        "failovers": summary.get("failovers"),
        "wall_s": time.time() - started,
    }


def prompt_tokens(http, system, question):
    """The prompt's tokens after the chat template, as the server counts them: a request that leaves the prompt no
    room is refused at once with the count (CONTEXT_LENGTH_EXCEEDED), before any model work. The first answer may be
    a lower bound from the text's size alone ("at least N tokens"); the second, leaving exactly that bound room,
    makes the server tokenize."""
    with urllib.request.urlopen(f"{http}/v1/models", timeout=30) as resp:
        model = json.load(resp)["data"][0]["id"]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    context = 32768
    max_tokens = context - 1
    for _ in range(2):
        body = {"model": model, "max_tokens": max_tokens, "messages": messages}
        req = urllib.request.Request(f"{http}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60).close()
            raise RuntimeError("the counting request was served")
        except urllib.error.HTTPError as e:
            text = e.read().decode()
        m = re.search(r"the prompt has (at least )?(\d+) tokens", text)
        if not m:
            break
        if not m.group(1):
            return int(m.group(2))
        max_tokens = context - int(m.group(2))
    raise RuntimeError(f"the server did not count the prompt's tokens: {text}")


def sized(http, build, kind, tokens):
    """`build(chars)` rescaled twice by the server's count, to about `tokens` tokens."""
    chars = tokens * CHARS_PER_TOKEN[kind]
    for _ in range(2):
        system, question = build(chars)
        chars *= tokens / prompt_tokens(http, system, question)
    return build(chars)


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def log_counts(path, since):
    """Retries, failovers and the workers' prefill seconds (draft, verifier) logged after byte offset `since`."""
    with open(path, errors="replace") as f:
        f.seek(since)
        text = re.sub(r"\x1b\[[0-9;]*m", "", f.read())
    retries = len(re.findall(r"resending the full context|replica failed|failing over", text))
    prefill = {"draft": 0.0, "verifier": 0.0}
    for m in re.finditer(r"prefilled .*?role=\"?(\w+)\"?.*?seconds=([0-9.]+)", text):
        prefill[m.group(1)] = prefill.get(m.group(1), 0.0) + float(m.group(2))
    return retries, prefill


def bench_prefill(easd, model, tokens):
    out = subprocess.run([easd, "bench", "model", "--model", model, "--prompt-tokens", str(tokens),
                          "--decode-tokens", "1", "--ks", "1", "--reps", "1"], capture_output=True, text=True)
    m = re.search(r"prefill: (\d+) tokens in ([0-9.]+) ms", out.stdout)
    return float(m.group(2)) / 1000 if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1000,2000,4000,8000,16000")
    ap.add_argument("--apis", default="grpc,openai")
    ap.add_argument("--code", type=int, default=4000, help="tokens of the code-file prompt (0: none)")
    ap.add_argument("--twelve-shot", action="store_true", help="also the 12-shot prompt of lines 7100-7111, twice")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="target/bench-long-prompts")
    ap.add_argument("--no-bench-model", action="store_true")
    args = ap.parse_args()
    easd = os.environ.get("EASD", os.path.join(ROOT, "target", "release", "easd"))
    os.makedirs(args.out, exist_ok=True)
    problems = gsm8k_lines()

    grpc_port, http_port = free_port(), free_port()
    log_path = os.path.join(args.out, "up.log")
    log = open(log_path, "w")
    env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")  # the `prefilled`, retry and failover lines
    up = subprocess.Popen([easd, "up", "--listen", f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}"],
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    url, http = f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
    rows = []
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"{http}/health", timeout=5)
                break
            except Exception:
                if up.poll() is not None or time.time() > deadline:
                    sys.exit(f"easd up did not come up; see {log_path}")
                time.sleep(1)
        prompts = [(f"few-shot {n}", *sized(http, lambda c: few_shot(problems, chars=c), "gsm8k", n))
                   for n in map(int, args.lengths.split(",")) if n]
        if args.code:
            prompts.append((f"code {args.code}", *sized(http, code_file, "code", args.code)))
        if args.twelve_shot:
            prompts += [("12-shot", *few_shot(problems, shots=12)), ("12-shot again", *few_shot(problems, shots=12))]
        for name, system, question in prompts:
            for api in args.apis.split(","):
                if name.startswith("12-shot") and api != "openai":
                    continue
                since = os.path.getsize(log_path)
                result = ask_grpc(easd, url, system, question, args.max_tokens) if api == "grpc" else \
                    ask_openai(http, system, question, args.max_tokens)
                log.flush()
                time.sleep(0.5)
                result["retries"], result["prefill"] = log_counts(log_path, since)
                result["rss_mib"] = rss_kib(up.pid, "VmRSS") / 1024
                result["peak_rss_mib"] = rss_kib(up.pid, "VmHWM") / 1024
                result.update(name=name, api=api)
                print(json.dumps(result), flush=True)
                rows.append(result)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()

    if not args.no_bench_model:
        # Once per prompt, at the length of its first answered row (the APIs' templates differ by a few tokens).
        benched = {}
        for r in rows:
            n = r.get("prompt_tokens")
            if n and r["name"].replace(" again", "") not in benched:
                benched[r["name"]] = {m: bench_prefill(easd, m, n) for m in ("draft", "target")}
                print(json.dumps({"bench": benched[r["name"]], "tokens": n}), flush=True)
            r["bench"] = benched.get(r["name"].replace(" again", ""))

    print()
    print("| prompt | API | prompt tokens | time to first token (s) | draft / target prefill in the run (s) "
          "| `bench model` draft + target prefill (s) | retries, failovers | RSS / peak (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['api']} | — | error after {r['wall_s']:.1f} s: {r['error']} | | | {r['retries']} | |")
            continue
        b = r.get("bench") or {}
        bench = f"{b['draft']:.1f} + {b['target']:.1f} = {b['draft'] + b['target']:.1f}" if b.get("draft") and b.get("target") else "—"
        p = r["prefill"]
        print(f"| {r['name']} | {r['api']} | {r['prompt_tokens']} | {r['ttft_s']:.1f} | {p.get('draft', 0):.1f} / "
              f"{p.get('verifier', 0):.1f} | {bench} | {r['retries']}, {r['failovers']} | "
              f"{r['rss_mib']:.0f} / {r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
