#!/usr/bin/env python3
"""scale_sim.py — the arithmetic and the simulation behind docs/SCALE.md.

Part 1 (arithmetic): decode step time of Llama-3-70B on 64 H200s split as
data-parallel replicas x tensor parallel (inside a host, NVLink) x pipeline
parallel (across hosts, InfiniBand), from bytes moved, FLOPs and collective costs.
Part 2 (simulation): prefix-cache hit rate of a multi-turn chat workload over 32
replicas under four routing policies (random, least-loaded, session hash,
cache-aware longest-prefix with a load guard), each replica an LRU block cache.

Every constant is named below with its source; change them and re-run:
    python3 scripts/scale_sim.py            # both parts, markdown tables
    python3 scripts/scale_sim.py --seed 2   # another workload draw
Nothing here runs at serving time; it is a design tool (stdlib only).
"""
import argparse
import collections
import random

# ---- hardware (datasheet leads; HBM derated to what kiln measures as reachable) ----
HBM_BW = 4.8e12 * 0.85   # H200 HBM3e 4.8 TB/s; ~85 % reachable by a streaming kernel
HBM_BYTES = 141e9        # H200 memory
PEAK_FLOPS = 989e12 * 0.6  # dense bf16 tensor-core peak, ~60 % reachable in GEMMs
NVLINK_BW = 450e9        # NVLink 4 through NVSwitch: 900 GB/s per GPU, 450 each way
NVLINK_LAT = 8e-6        # NCCL small all-reduce latency inside one host (ring/LL)
IB_BW = 50e9             # one 400 Gb/s NDR NIC per GPU
IB_LAT = 20e-6           # cross-host small-message collective / send latency

# ---- model: Llama-3-70B shape ----
N_LAYER, N_EMBD, N_FF, N_KV, HEAD_DIM, VOCAB = 80, 8192, 28672, 8, 128, 128256
PARAMS = 70.6e9
KV_BYTES_TOKEN = N_LAYER * 2 * N_KV * HEAD_DIM * 2  # f16 K and V: 327,680 B


def weight_bytes(dtype):
    return PARAMS * {"f16": 2.0, "q4_0": 4.5 / 8}[dtype]


def allreduce_time(size, ranks, bw, lat):
    """Ring all-reduce: each rank sends and receives 2 (r-1)/r of the buffer."""
    if ranks == 1:
        return 0.0
    return lat + 2 * (ranks - 1) / ranks * size / bw


def decode_step(dtype, tp, pp, batch, ctx, tp_cross_host=False):
    """Seconds per decode step of one replica (tp x pp GPUs) with `batch` sequences
    of `ctx` cached tokens; returns (step_s, per_gpu_bytes_needed)."""
    w = weight_bytes(dtype) / (tp * pp)          # weights per GPU
    kv_heads_per_rank = max(1, N_KV // tp)        # replicated when tp > n_kv
    kv = batch * ctx * KV_BYTES_TOKEN * kv_heads_per_rank / N_KV / pp
    mem_t = (w + kv) / HBM_BW
    flops = 2 * PARAMS * batch / (tp * pp)
    cmp_t = flops / PEAK_FLOPS
    # two all-reduces per layer (attention output, FFN down) of batch x n_embd f16
    bw, lat = (IB_BW, IB_LAT) if tp_cross_host else (NVLINK_BW, NVLINK_LAT)
    ar = allreduce_time(batch * N_EMBD * 2, tp, bw, lat)
    comm_t = 2 * (N_LAYER / pp) * ar
    stage = max(mem_t, cmp_t) + comm_t
    # pipeline: with pp micro-batches in flight every stage is busy; a token's latency is
    # pp stages plus pp-1 hops of batch x n_embd f16 activations over IB
    hop = IB_LAT + batch * N_EMBD * 2 / IB_BW
    return stage, stage * pp + (pp - 1) * hop, w + kv


def part1(batch_per_replica, ctx):
    rows = []
    cfgs = [("DP32 x TP2", 32, 2, 1, False), ("DP16 x TP4", 16, 4, 1, False),
            ("DP8 x TP8", 8, 8, 1, False), ("DP4 x TP8 x PP2", 4, 8, 2, False),
            ("DP4 x TP16 (across 2 hosts)", 4, 16, 1, True)]
    for dtype in ("f16", "q4_0"):
        for name, dp, tp, pp, cross in cfgs:
            stage, latency, need = decode_step(dtype, tp, pp, batch_per_replica, ctx, cross)
            fits = need <= HBM_BYTES * 0.9
            # pipelined replica emits `batch` tokens per stage time (pp micro-batches)
            agg = dp * batch_per_replica / stage if fits else 0.0
            rows.append((dtype, name, dp * tp * pp, need / 1e9, fits, latency * 1e3,
                         1 / latency, agg))
    print(f"### Part 1: decode, Llama-3-70B, {batch_per_replica} sequences per replica, "
          f"{ctx} cached tokens each\n")
    print("| weights | layout | GPUs | GB per GPU | fits | token latency ms | tok/s per seq "
          "| aggregate tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {'yes' if r[4] else 'NO'} | "
              f"{r[5]:.1f} | {r[6]:.1f} | {r[7]:,.0f} |")
    print()


def part2(seed, n_replicas=32, n_sessions=4000, turns=6, sys_prompts=40, block=16,
          cache_blocks=20000, load_guard=1.5):
    """Multi-turn chats: each session starts with one of `sys_prompts` shared system
    prompts (1024 tokens), then grows by a user turn (~150) and an answer (~300) per
    turn; every turn re-sends the whole conversation. A replica caches full blocks
    (LRU, `cache_blocks` each ~= 45 GB of Llama-3-70B KV). Hit = prompt blocks found."""
    rng = random.Random(seed)
    sessions = []
    for s in range(n_sessions):
        sp = rng.randrange(sys_prompts)
        toks = [("sys", sp, i) for i in range(1024)]
        sessions.append(toks)

    def blocks_of(toks):
        h, out = 0, []
        for i in range(len(toks) // block):
            h = hash((h, tuple(toks[i * block:(i + 1) * block])))
            out.append(h)
        return out

    events = []  # (time, session, turn)
    for s in range(n_sessions):
        t = rng.uniform(0, 1000)
        for turn in range(turns):
            events.append((t, s, turn))
            t += rng.expovariate(1 / 30)
    events.sort()
    results = {}
    for policy in ("random", "least_loaded", "session_hash", "cache_aware"):
        caches = [collections.OrderedDict() for _ in range(n_replicas)]
        load = [0.0] * n_replicas
        convo = [list(x) for x in sessions]
        hit = total = 0
        for t, s, turn in events:
            toks = convo[s]
            toks += [("u", s, turn, i) for i in range(rng.randint(50, 250))]
            bl = blocks_of(toks)
            for r in range(n_replicas):
                load[r] *= 0.995  # decaying recent work
            if policy == "random":
                r = rng.randrange(n_replicas)
            elif policy == "least_loaded":
                r = min(range(n_replicas), key=lambda i: load[i])
            elif policy == "session_hash":
                r = hash(("sess", s)) % n_replicas
            else:
                def match(i):
                    c, n = caches[i], 0
                    for b in bl:
                        if b not in c:
                            break
                        n += 1
                    return n
                lo = min(load)
                cands = [i for i in range(n_replicas) if load[i] <= max(lo * load_guard, lo + 64)]
                r = max(cands, key=lambda i: (match(i), -load[i]))
            c = caches[r]
            n_hit = 0
            for b in bl:
                if b in c:
                    n_hit += 1
                    c.move_to_end(b)
                else:
                    break
            hit += n_hit
            total += len(bl)
            for b in bl[n_hit:]:
                c[b] = True
            while len(c) > cache_blocks:
                c.popitem(last=False)
            load[r] += len(bl) - n_hit + 20
            toks += [("a", s, turn, i) for i in range(rng.randint(100, 500))]
        results[policy] = (hit / total, max(load) / (sum(load) / n_replicas))
    print(f"### Part 2: prefix-cache hit rate, {n_replicas} replicas, {n_sessions} sessions x "
          f"{turns} turns, {sys_prompts} shared system prompts (seed {seed})\n")
    print("| policy | prompt blocks served from cache | max/mean replica load |")
    print("|---|---|---|")
    for k, (h, imb) in results.items():
        print(f"| {k} | {h * 100:.1f} % | {imb:.2f} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096)
    a = ap.parse_args()
    part1(a.batch, a.ctx)
    part2(a.seed)


if __name__ == "__main__":
    main()
