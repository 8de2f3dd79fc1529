#!/usr/bin/env bash
# Static checks of the deployment files, fast enough for CI:
#   1. docker compose config -q (with and without the observability profile);
#   2. every Kubernetes manifest under deploy/k8s/ against the API schemas (kubernetes-validate,
#      installed with pip into a venv under target/, reused across runs).
# A missing tool is reported as SKIP, not as a failure; an invalid file fails (exit 1).
#
# Environment: K8S_VERSION (schema version, default the validator's newest),
#              EASD_DEPLOY_VENV (venv location, default target/deploy-venv).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 1
failed=0
checked=0

if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
else
    compose=()
fi
if [[ ${#compose[@]} -eq 0 ]]; then
    echo "deploy/check.sh: SKIP compose: neither 'docker compose' nor 'docker-compose' found"
else
    for profile in "" observability; do
        args=()
        [[ -n "$profile" ]] && args=(--profile "$profile")
        # A throwaway models dir so the check does not depend on ./models existing.
        if EASD_MODELS_DIR=/tmp "${compose[@]}" -f docker-compose.yml "${args[@]}" config -q; then
            echo "deploy/check.sh: ok   compose config${profile:+ (profile $profile)}"
            checked=$((checked + 1))
        else
            echo "deploy/check.sh: FAIL compose config${profile:+ (profile $profile)}"
            failed=1
        fi
    done
fi

venv="${EASD_DEPLOY_VENV:-$repo/target/deploy-venv}"
validator="$venv/bin/kubernetes-validate"
if [[ ! -x "$validator" ]]; then
    if python3 -m venv "$venv" >/dev/null 2>&1 \
        && "$venv/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0' >/dev/null 2>&1; then
        :
    else
        rm -rf "$venv"
        validator=""
    fi
fi
if [[ -z "$validator" ]]; then
    echo "deploy/check.sh: SKIP k8s: could not install kubernetes-validate with pip (no python3 venv or no package index)"
else
    mapfile -t manifests < <(find deploy/k8s -name '*.yaml' | sort)
    version_args=()
    [[ -n "${K8S_VERSION:-}" ]] && version_args=(--kubernetes-version "$K8S_VERSION")
    if out=$("$validator" --strict "${version_args[@]}" "${manifests[@]}" 2>&1); then
        echo "deploy/check.sh: ok   k8s schema validation of ${#manifests[@]} files"
        checked=$((checked + 1))
    else
        echo "$out"
        echo "deploy/check.sh: FAIL k8s schema validation"
        failed=1
    fi
fi

echo "deploy/check.sh: $checked checks passed, $failed failed"
exit "$failed"
