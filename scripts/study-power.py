#!/usr/bin/env python3
"""Power of the exact two-sided McNemar test for docs/STUDY-PROTOCOL.md (standard library only).

Model: each of n paired problems is discordant with probability psi (p10 + p01); a discordant problem favours EASD
with probability (psi + delta) / (2 psi), where delta = p10 - p01 is the accuracy difference.

* normal approximation (Connor 1987): power = Phi((|delta| sqrt(n) - z_{1-a/2} sqrt(psi)) / sqrt(psi - delta^2)),
  n for power 1 - beta = (z_{1-a/2} sqrt(psi) + z_{1-beta} sqrt(psi - delta^2))^2 / delta^2;
* exact: sum over D ~ Binomial(n, psi) discordant problems of P(the exact conditional test, Binomial(D, 1/2),
  rejects at level a | D), the count favouring EASD being Binomial(D, (psi + delta) / (2 psi)).

Usage: scripts/study-power.py [N]   (default 1000)
"""
import math
import sys
from statistics import NormalDist

PHI = NormalDist()
PSIS = (0.20, 0.25, 0.30)
DELTAS = (0.03, 0.05, 0.07, 0.10)
ALPHAS = (0.05, 0.025)  # 0.025: Holm's first step over two tests (the worst case for the primary test)


def n_normal(psi, delta, alpha, power=0.8):
    za, zb = PHI.inv_cdf(1 - alpha / 2), PHI.inv_cdf(power)
    return (za * math.sqrt(psi) + zb * math.sqrt(psi - delta**2)) ** 2 / delta**2


def power_normal(n, psi, delta, alpha):
    za = PHI.inv_cdf(1 - alpha / 2)
    return PHI.cdf((abs(delta) * math.sqrt(n) - za * math.sqrt(psi)) / math.sqrt(psi - delta**2))


def log_binom(n, k, p):
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log(1 - p)


_critical = {}


def critical(d, alpha):
    """Largest m with 2 P(X <= m) <= alpha for X ~ Binomial(d, 1/2) (reject when min(b, c) <= m); -1 if none."""
    if (d, alpha) not in _critical:
        cdf, m = 0.0, -1
        for k in range(d + 1):
            cdf += math.exp(log_binom(d, k, 0.5))
            if min(1.0, 2 * cdf) > alpha:
                break
            m = k
        _critical[(d, alpha)] = m
    return _critical[(d, alpha)]


def power_exact(n, psi, delta, alpha):
    favour = (psi + delta) / (2 * psi)
    total = 0.0
    for d in range(n + 1):
        weight = math.exp(log_binom(n, d, psi))
        if weight < 1e-15:
            continue
        m = critical(d, alpha)
        if m < 0:
            continue
        tails = sum(math.exp(log_binom(d, k, favour)) for k in list(range(m + 1)) + list(range(d - m, d + 1)))
        total += weight * tails
    return total


def smallest_effect(n, psi, alpha, power=0.8):
    """Smallest delta (to 0.001) with exact power >= `power`."""
    lo, hi = 0.001, psi
    while hi - lo > 0.0005:
        mid = (lo + hi) / 2
        if power_exact(n, psi, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print("Pairs needed for 80% power (normal approximation):\n")
    print("| α | discordant ψ | " + " | ".join(f"δ = {d:.0%}" for d in DELTAS) + " |")
    print("|---|---:|" + "---:|" * len(DELTAS))
    for alpha in ALPHAS:
        for psi in PSIS:
            cells = " | ".join(str(math.ceil(n_normal(psi, d, alpha))) for d in DELTAS)
            print(f"| {alpha} | {psi:.2f} | {cells} |")
    print(f"\nPower at n = {n}, exact (normal approximation in brackets):\n")
    print("| α | discordant ψ | " + " | ".join(f"δ = {d:.0%}" for d in DELTAS) + " | smallest δ at 80% (exact) |")
    print("|---|---:|" + "---:|" * (len(DELTAS) + 1))
    for alpha in ALPHAS:
        for psi in PSIS:
            cells = " | ".join(
                f"{power_exact(n, psi, d, alpha):.2f} ({power_normal(n, psi, d, alpha):.2f})" for d in DELTAS
            )
            print(f"| {alpha} | {psi:.2f} | {cells} | {smallest_effect(n, psi, alpha):.3f} |")


if __name__ == "__main__":
    main()
