#!/usr/bin/env python3
"""tf_compare.py A B — top-1 agreement and mean KL(A || B) of two teacher-forced top-K
log-prob files in llama_dump's "tf" format (llama_dump.c, kiln_tf.c): the KL over A's
top-K tokens that B also lists plus one tail bucket, as tests/slow/test_parity.c computes
it (a lower bound of the full KL)."""
import math
import sys


def load(path):
    rows = {}
    with open(path) as f:
        lines = f.read().split("\n")
    for line in lines[1:]:
        if not line.strip():
            continue
        fields = line.split()
        rows[int(fields[0])] = [(int(a.split(":")[0]), float(a.split(":")[1])) for a in fields[1:]]
    return rows


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    same, kls = 0, []
    for i in sorted(a):
        if i not in b:
            continue
        pb = dict(b[i])
        same += a[i][0][0] == b[i][0][0]
        kl = sa = sb = 0.0
        for tok, lp in a[i]:
            if tok in pb:
                kl += math.exp(lp) * (lp - pb[tok])
                sa += math.exp(lp)
                sb += math.exp(pb[tok])
        ta, tb = 1 - sa, 1 - sb
        if ta > 1e-12 and tb > 1e-12:
            kl += ta * math.log(ta / tb)
        kls.append(kl)
    print("top-1 %.2f%% (%d/%d), mean KL %.3g" % (100 * same / len(kls), same, len(kls), sum(kls) / len(kls)))


if __name__ == "__main__":
    main()
