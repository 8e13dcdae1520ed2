"""Device probe: cross_entropy row kernel variants and softmax variants against the
copy rate, then coil's softmax timed repeatedly (run from the repository root on a
CUDA machine)."""
import os, sys, torch, triton, triton.testing, subprocess
import triton.language as tl
dev = torch.device("cuda")
def t(fn, rep=200):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3
N, C = 16384, 32000
x = torch.randn(N, C, device=dev).to(torch.bfloat16)
big = torch.empty(2 * N * C // 2 * 2, device=dev, dtype=torch.bfloat16)
src = torch.randn(N * C, device=dev).to(torch.bfloat16)
tc = t(lambda: big[: N * C].copy_(src))
rate = 2 * N * C * 2 / (tc * 1e-6)
print(f"copy {tc:.1f} us -> {rate/1e12:.2f} TB/s; CE floor {N*C*2/rate*1e6:.1f} us", flush=True)
ref_m = x.float().amax(1); ref_s = torch.exp(x.float() - ref_m[:, None]).sum(1)

@triton.jit
def k_base(in_ptr, m_ptr, s_ptr, rnumel, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    r0 = tl.arange(0, RBLOCK)[None, :]
    acc0 = tl.full([1, RBLOCK], float("-inf"), tl.float32)
    acc1 = tl.full([1, RBLOCK], 0, tl.float32)
    rm = tl.full([1, 1], float("-inf"), tl.float32)
    for off in range(0, rnumel, RBLOCK):
        r = off + r0
        mask = r < rnumel
        v = tl.load(in_ptr + row * rnumel + r, mask, other=0).to(tl.float32)
        acc0 = tl.where(mask, tl.maximum(acc0, v, propagate_nan=tl.PropagateNan.ALL), acc0)
        bm = tl.max(tl.where(mask, v, float("-inf")), 1)[:, None]
        nm = tl.maximum(rm, bm)
        sc = tl.where(nm == float("-inf"), 1.0, tl.exp(rm - nm))
        e = tl.where(mask & (nm != float("-inf")), tl.exp(v - nm), 0.0)
        acc1 = acc1 * sc + e
        rm = nm
    tl.store(m_ptr + row + tl.arange(0, 1)[:, None], tl.max(acc0, 1)[:, None])
    tl.store(s_ptr + row + tl.arange(0, 1)[:, None], tl.sum(acc1, 1)[:, None])

@triton.jit
def _upd(m, s, v):
    d = tl.where(v == m, 0.0, v - m)
    e = tl.exp(-tl.abs(d))
    s = tl.where(d > 0, s * e + 1.0, s + e)
    m = tl.maximum(m, v, propagate_nan=tl.PropagateNan.ALL)
    return m, s

@triton.jit
def k_lane(in_ptr, m_ptr, s_ptr, rnumel, MAIN: tl.constexpr, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    r0 = tl.arange(0, RBLOCK)[None, :]
    m = tl.full([1, RBLOCK], float("-inf"), tl.float32)
    s = tl.full([1, RBLOCK], 0, tl.float32)
    for off in range(0, MAIN, RBLOCK):
        v = tl.load(in_ptr + row * rnumel + off + r0).to(tl.float32)
        m, s = _upd(m, s, v)
    if MAIN < rnumel:
        r = MAIN + r0
        mask = r < rnumel
        v = tl.load(in_ptr + row * rnumel + r, mask, other=0).to(tl.float32)
        m2, s2 = _upd(m, s, v)
        m = tl.where(mask, m2, m)
        s = tl.where(mask, s2, s)
    M = tl.max(m, 1)[:, None]
    S = tl.sum(tl.where(s == 0, 0.0, s * tl.exp(m - M)), 1)[:, None]
    tl.store(m_ptr + row + tl.arange(0, 1)[:, None], M)
    tl.store(s_ptr + row + tl.arange(0, 1)[:, None], S)

@triton.jit
def k_rowmax_peel(in_ptr, m_ptr, s_ptr, rnumel, MAIN: tl.constexpr, RBLOCK: tl.constexpr):
    # block row max per iteration (current scheme), main loop unmasked
    row = tl.program_id(0)
    r0 = tl.arange(0, RBLOCK)[None, :]
    acc1 = tl.full([1, RBLOCK], 0, tl.float32)
    rm = tl.full([1, 1], float("-inf"), tl.float32)
    for off in range(0, MAIN, RBLOCK):
        v = tl.load(in_ptr + row * rnumel + off + r0).to(tl.float32)
        bm = tl.max(v, 1)[:, None]
        nm = tl.maximum(rm, bm)
        sc = tl.exp(rm - nm)
        acc1 = acc1 * sc + tl.exp(v - nm)
        rm = nm
    if MAIN < rnumel:
        r = MAIN + r0
        mask = r < rnumel
        v = tl.load(in_ptr + row * rnumel + r, mask, other=float("-inf")).to(tl.float32)
        nm = tl.maximum(rm, tl.max(v, 1)[:, None])
        acc1 = acc1 * tl.exp(rm - nm) + tl.exp(v - nm)
        rm = nm
    tl.store(m_ptr + row + tl.arange(0, 1)[:, None], rm)
    tl.store(s_ptr + row + tl.arange(0, 1)[:, None], tl.sum(acc1, 1)[:, None])

@triton.jit
def k_split(in_ptr, pm_ptr, ps_ptr, rnumel, CHUNK: tl.constexpr, K: tl.constexpr, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    r = c * CHUNK + tl.arange(0, RBLOCK)[None, :]
    mask = (tl.arange(0, RBLOCK)[None, :] < CHUNK) & (r < rnumel)
    v = tl.load(in_ptr + row * rnumel + r, mask, other=float("-inf")).to(tl.float32)
    M = tl.max(v, 1)[:, None]
    S = tl.sum(tl.exp(v - M), 1)[:, None]
    tl.store(pm_ptr + row * K + c + tl.arange(0, 1)[:, None], M)
    tl.store(ps_ptr + row * K + c + tl.arange(0, 1)[:, None], S)

@triton.jit
def k_combine(pm_ptr, ps_ptr, m_ptr, s_ptr, K: tl.constexpr, XB: tl.constexpr):
    rows = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    k = tl.arange(0, K)[None, :]
    pm = tl.load(pm_ptr + rows * K + k)
    ps = tl.load(ps_ptr + rows * K + k)
    M = tl.max(pm, 1)[:, None]
    S = tl.sum(ps * tl.exp(pm - M), 1)[:, None]
    tl.store(m_ptr + rows, M)
    tl.store(s_ptr + rows, S)

@triton.jit
def k_full(in_ptr, m_ptr, s_ptr, rnumel, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    r = tl.arange(0, RBLOCK)[None, :]
    mask = r < rnumel
    v = tl.load(in_ptr + row * rnumel + r, mask, other=float("-inf")).to(tl.float32)
    M = tl.max(v, 1)[:, None]
    S = tl.sum(tl.exp(v - M), 1)[:, None]
    tl.store(m_ptr + row + tl.arange(0, 1)[:, None], M)
    tl.store(s_ptr + row + tl.arange(0, 1)[:, None], S)

m = torch.empty(N, device=dev); s = torch.empty(N, device=dev)
def check(name, us):
    ok = torch.allclose(m, ref_m) and torch.allclose(s, ref_s, rtol=1e-3)
    print(f"{name:40s} {us:7.1f} us  {N*C*2/(us*1e-6)/rate*100:5.1f}% copy {'ok' if ok else 'WRONG'}", flush=True)
for rb, w in ((1024, 2), (1024, 4), (2048, 4), (2048, 8), (512, 2), (512, 1), (1024, 1)):
    f = lambda: k_base[(N,)](x, m, s, C, RBLOCK=rb, num_warps=w)
    m.zero_(); f(); check(f"base rb{rb} w{w}", t(f))
for rb, w in ((1024, 2), (1024, 4), (2048, 4), (2048, 8), (512, 2), (512, 1), (1024, 1), (256, 1), (4096, 8)):
    main = C // rb * rb
    f = lambda: k_rowmax_peel[(N,)](x, m, s, C, MAIN=main, RBLOCK=rb, num_warps=w)
    m.zero_(); f(); check(f"rowmax_peel rb{rb} w{w}", t(f))
for rb, w in ((1024, 2), (1024, 4), (2048, 4), (2048, 8), (512, 2), (512, 1), (1024, 1), (256, 1), (4096, 8)):
    main = C // rb * rb
    f = lambda: k_lane[(N,)](x, m, s, C, MAIN=main, RBLOCK=rb, num_warps=w)
    m.zero_(); f(); check(f"lane rb{rb} w{w}", t(f))
for K, w in ((2, 8), (2, 16), (4, 4), (4, 8), (8, 4), (8, 2), (16, 2), (16, 1)):
    chunk = -(-C // K); rb = triton.next_power_of_2(chunk)
    pm = torch.empty(N * K, device=dev); ps = torch.empty(N * K, device=dev)
    def f():
        k_split[(N, K)](x, pm, ps, C, CHUNK=chunk, K=K, RBLOCK=rb, num_warps=w)
        k_combine[(N // 64,)](pm, ps, m, s, K=K, XB=64, num_warps=4)
    m.zero_(); f(); check(f"split K{K} w{w}", t(f))
for w in (8, 16, 32):
    f = lambda: k_full[(N,)](x, m, s, C, RBLOCK=32768, num_warps=w)
    m.zero_(); f(); check(f"full w{w}", t(f))

# ---------------- softmax 32768x4096 bf16
R, D = 32768, 4096
xs = torch.randn(R, D, device=dev).to(torch.bfloat16)
ys = torch.empty_like(xs)
ref = torch.softmax(xs.float(), -1).to(torch.bfloat16)

@triton.jit
def _maxnan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

@triton.jit
def k_soft(in_ptr, out_ptr, RBLOCK: tl.constexpr, NANMODE: tl.constexpr, RECIP: tl.constexpr):
    row = tl.program_id(0)
    r = tl.arange(0, RBLOCK)[None, :]
    v = tl.load(in_ptr + row * RBLOCK + r).to(tl.float32)
    if NANMODE == 0:
        M = tl.max(v, 1)[:, None]
        M = tl.where(tl.max((v != v).to(tl.int8), 1)[:, None] > 0, float("nan"), M)
    elif NANMODE == 1:
        M = tl.reduce(v, 1, _maxnan)[:, None]
    else:
        M = tl.max(v, 1)[:, None]
    e = tl.exp(v - M)
    S = tl.sum(e, 1)[:, None]
    if RECIP:
        o = e * (1.0 / S)
    else:
        o = e / S
    tl.store(out_ptr + row * RBLOCK + r, o.to(tl.bfloat16))

bytes_s = 2 * R * D * 2
for nm in (0, 1, 2):
    for rc in (False, True):
        for w in (4, 8):
            f = lambda: k_soft[(R,)](xs, ys, RBLOCK=D, NANMODE=nm, RECIP=rc, num_warps=w)
            ys.zero_(); f()
            ok = torch.allclose(ys.float(), ref.float(), atol=1e-2, rtol=1e-2)
            ts = [t(f, 100) for _ in range(3)]
            print(f"softmax nan{nm} recip{int(rc)} w{w}: " + " ".join(f"{v:.1f}" for v in ts) + f" us ({bytes_s/(min(ts)*1e-6)/rate*100:.0f}%) {'ok' if ok else 'WRONG'}", flush=True)

sys.path.insert(0, os.getcwd())
import coil
from torch.fx.experimental.proxy_tensor import make_fx
from bench import workloads as W
inst = W.softmax(32768, 4096, torch.bfloat16).build(dev)
gm = make_fx(inst.fn)(*inst.inputs)
comp = coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton"))
comp(*inst.inputs)
keep = []
for i in range(8):
    out = comp(*inst.inputs)[0]
    print(f"coil softmax run {i}: {t(lambda: comp(*inst.inputs), 100):.1f} us out@{out.data_ptr() % (1<<32):#x}", flush=True)
    keep.append(torch.empty(int(3e6) * (i + 1), device=dev))
print(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw", "--format=csv"], capture_output=True, text=True).stdout)
