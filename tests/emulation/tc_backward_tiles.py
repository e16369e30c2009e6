"""Tile-level emulation of backward_kernel.cuh's loops (dK/dV blocks over the GQA group's query
blocks from m_first, the first_visible / key_gap masks, zero-filled padding rows with lse = 0,
kv_stride rows, atomic and deterministic dQ) against a direct float64 formula. No GPU needed:
  python3 tests/emulation/tc_backward_tiles.py   -> per-case max errors ~1e-15
"""
import numpy as np, math, random
BM = BN = 64
def reference(q, k, v, do, scale, causal, s):
    B, Hq, Sq, D = q.shape; Hkv, Sk = k.shape[1], k.shape[2]; g = Hq // Hkv
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    out = np.zeros_like(q); lse = np.zeros((B, Hq, Sq))
    for b in range(B):
        for h in range(Hq):
            kk, vv = k[b, h // g], v[b, h // g]
            S = q[b, h] @ kk.T * scale
            j = np.arange(Sk); i = np.arange(Sq)
            vis = (j[None, :] % s == 0) & ((j[None, :] <= i[:, None]) if causal else True)
            S = np.where(vis, S, -np.inf)
            m = S.max(1, keepdims=True); P = np.exp(S - m); l = P.sum(1, keepdims=True); P /= l
            out[b, h] = P @ vv; lse[b, h] = (m + np.log(l))[:, 0]
            dP = do[b, h] @ vv.T; Dd = (do[b, h] * out[b, h]).sum(1, keepdims=True)
            dS = P * (dP - Dd)
            dq[b, h] = scale * dS @ kk; dk[b, h // g] += scale * dS.T @ q[b, h]; dv[b, h // g] += P.T @ do[b, h]
    return out, lse, dq, dk, dv

def kernels(q, k, v, do, out, lse, scale, causal, s):
    B, Hq, Sq, D = q.shape; Hkv, Sk = k.shape[1], k.shape[2]; group = Hq // Hkv
    kept = -(-Sk // s); sl2 = scale / math.log(2); log2e = 1 / math.log(2)
    delta = (do * out).sum(-1)
    dq_acc = np.zeros((B, Hq, Sq, D)); dk = np.full_like(k, np.nan); dv = np.full_like(v, np.nan)
    n_blocks = -(-kept // BN)
    for blk in range(n_blocks * B * Hkv):
        n_block = blk % n_blocks; bh = blk // n_blocks; b = bh // Hkv; hkv = bh % Hkv
        n_begin = n_block * BN; keys = min(BN, kept - n_begin)
        K = np.zeros((BN, D)); V = np.zeros((BN, D))
        K[:keys] = k[b, hkv, (n_begin + np.arange(keys)) * s]; V[:keys] = v[b, hkv, (n_begin + np.arange(keys)) * s]
        dK = np.zeros((BN, D)); dV = np.zeros((BN, D))
        m_blocks = -(-Sq // BM); m_first = min(n_begin * s // BM, m_blocks) if causal else 0
        spb = m_blocks - m_first; steps = group * spb
        for step in range(steps):
            h = hkv * group + step // spb; m_begin = (m_first + step % spb) * BM
            rows = min(BM, Sq - m_begin)
            Q = np.zeros((BM, D)); dO = np.zeros((BM, D)); L = np.zeros(BM); Dl = np.zeros(BM)
            Q[:rows] = q[b, h, m_begin:m_begin + rows]; dO[:rows] = do[b, h, m_begin:m_begin + rows]
            L[:rows] = lse[b, h, m_begin:m_begin + rows]; Dl[:rows] = delta[b, h, m_begin:m_begin + rows]
            needs = n_begin + BN > kept or (causal and (n_begin + BN - 1) * s > m_begin)
            X = (K @ Q.T) * sl2 - (L * log2e)[None, :]
            if needs:
                for r in range(BN):
                    key = n_begin + r
                    first = BM if key >= kept else (key * s - m_begin if causal else 0)
                    fv = max(min(first, BM), 0)
                    X[r, :fv] = -np.inf
            Pt = np.exp2(X)
            dV += Pt @ dO
            dSt = Pt * (V @ dO.T - Dl[None, :])
            dK += dSt @ Q
            dq_rows = dSt.T @ K
            dq_acc[b, h, m_begin:m_begin + rows] += dq_rows[:rows]
        for r in range(keys):
            dk[b, hkv, (n_begin + r) * s] = dK[r] * scale; dv[b, hkv, (n_begin + r) * s] = dV[r]
        if s > 1:
            for row in range(n_begin * s, min((n_begin + BN) * s, Sk)):
                if row % s: dk[b, hkv, row] = 0; dv[b, hkv, row] = 0
    dq_atomic = dq_acc * scale
    # deterministic dq kernel
    dq_det = np.full_like(q, np.nan); nmb = -(-Sq // BM)
    for blk in range(nmb * B * Hq):
        m_block = nmb - 1 - blk % nmb; bh = blk // nmb; b = bh // Hq; h = bh % Hq; hkv = h // group
        m_begin = m_block * BM; rows = min(BM, Sq - m_begin)
        key_end = min((m_begin + rows - 1) // s + 1, kept) if causal else kept
        nb = -(-key_end // BN)
        Q = np.zeros((BM, D)); dO = np.zeros((BM, D)); Q[:rows] = q[b, h, m_begin:m_begin + rows]; dO[:rows] = do[b, h, m_begin:m_begin + rows]
        real = (np.arange(BM) < rows) & (nb > 0)
        L = np.where(real, np.pad(lse[b, h, m_begin:m_begin + rows], (0, BM - rows)) * log2e, np.inf)
        Dl = np.where(real, np.pad(delta[b, h, m_begin:m_begin + rows], (0, BM - rows)), 0)
        row_end = lambda qq: min(qq // s + 1, kept) if causal else kept
        gap = np.array([key_end - row_end(m_begin + r) for r in range(BM)])
        dQ = np.zeros((BM, D))
        for n_block in range(nb):
            n_begin = n_block * BN; keys = min(BN, key_end - n_begin)
            K = np.zeros((BN, D)); V = np.zeros((BN, D))
            K[:keys] = k[b, hkv, (n_begin + np.arange(keys)) * s]; V[:keys] = v[b, hkv, (n_begin + np.arange(keys)) * s]
            X = (Q @ K.T) * sl2 - L[:, None]
            needs = n_begin + BN > kept or (causal and (n_begin + BN - 1) * s > m_begin)
            bk = min(key_end - n_begin, BM + BN)
            if needs:
                for r in range(BM): X[r, max(bk - gap[r], 0):] = -np.inf
            P = np.exp2(X)
            dS = P * (dO @ V.T - Dl[:, None])
            dQ += dS @ K
        dq_det[b, h, m_begin:m_begin + rows] = dQ[:rows] * scale
    return dq_atomic, dq_det, dk, dv

rng = np.random.default_rng(1); worst = 0
cases = [(2,3,3,77,129,32,False,1),(1,2,2,129,129,32,True,1),(1,2,2,100,37,32,True,1),(1,2,2,37,100,32,True,1),
         (1,2,2,65,130,32,False,3),(1,2,2,200,200,32,True,4),(1,1,1,20,30,32,True,50),(1,8,2,33,70,32,False,1),
         (1,6,1,40,41,32,True,1),(1,2,2,1,300,32,False,1),(1,2,2,20,1,32,False,1),(1,1,1,300,300,32,True,2)]
for (B,Hq,Hkv,Sq,Sk,D,causal,s) in cases:
    q = rng.uniform(-1,1,(B,Hq,Sq,D)); k = rng.uniform(-1,1,(B,Hkv,Sk,D)); v = rng.uniform(-1,1,(B,Hkv,Sk,D)); do = rng.uniform(-1,1,(B,Hq,Sq,D))
    scale = 1/math.sqrt(D)
    out, lse, dq, dk, dv = reference(q,k,v,do,scale,causal,s)
    a, d, dk2, dv2 = kernels(q,k,v,do,out,lse,scale,causal,s)
    errs = [np.abs(x-y).max() if x.size else 0 for x,y in ((a,dq),(d,dq),(dk2,dk),(dv2,dv))]
    print((B,Hq,Hkv,Sq,Sk,D,causal,s), ["%.1e"%e for e in errs])
    worst = max(worst, *errs)
print("worst", worst)
