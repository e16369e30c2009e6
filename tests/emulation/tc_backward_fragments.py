"""Host (numpy) emulation of the tensor-core backward's warp-level fragment maps: ldmatrix (.trans)
and mma.m16n8k16 per the PTX fragment layouts, driven by the lane-offset formulas of
warp_gemm.cuh and backward_kernel.cuh (S^T = K Q^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q,
the dS tile store and dQ += dS K; the deterministic kernel's S, dQ). No GPU needed:
  python3 tests/emulation/tc_backward_fragments.py   -> "all fragment maps match: True"
"""
# using the same lane-offset formulas as warp_gemm.cuh / backward_kernel.cuh.
import numpy as np
rng = np.random.default_rng(0)

def ldmatrix_x4(smem, addr, trans):  # addr[lane] = element offset of the row lane provides
    r = np.zeros((32, 4, 2))
    for i in range(4):
        rows = [smem[addr[8*i + j]: addr[8*i + j] + 8] for j in range(8)]
        m = np.array(rows)  # 8x8, row j from lane 8i+j
        if trans: m = m.T
        for T in range(32):
            r[T, i] = m[T // 4, 2*(T % 4): 2*(T % 4) + 2]
    return r

def mma(d, a, b0, b1):  # d: (32,4), a: (32,4,2), b0,b1: (32,2)
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for T in range(32):
        g, c = T // 4, 2 * (T % 4)
        A[g, c:c+2] = a[T, 0]; A[g+8, c:c+2] = a[T, 1]; A[g, c+8:c+10] = a[T, 2]; A[g+8, c+8:c+10] = a[T, 3]
        B[c:c+2, g] = b0[T]; B[c+8:c+10, g] = b1[T]
    C = A @ B
    for T in range(32):
        g, c = T // 4, 2 * (T % 4)
        d[T, 0] += C[g, c]; d[T, 1] += C[g, c+1]; d[T, 2] += C[g+8, c]; d[T, 3] += C[g+8, c+1]

def q_lane_offset(lane, stride): return (lane & 15) * stride + (lane >> 4) * 8
def k_lane_offset(lane, stride): return ((lane & 7) + ((lane >> 4) << 3)) * stride + ((lane >> 3) & 1) * 8
def v_lane_offset(lane, stride): return (lane & 15) * stride + (lane >> 4) * 8

def warp_qk(smem, a_base, b_base, stride, ntiles, ksteps):
    s = np.zeros((ntiles, 32, 4))
    for ks in range(ksteps):
        a = ldmatrix_x4(smem, [a_base + q_lane_offset(l, stride) + ks*16 for l in range(32)], False)
        for t in range(0, ntiles, 2):
            b = ldmatrix_x4(smem, [b_base + k_lane_offset(l, stride) + t*8*stride + ks*16 for l in range(32)], False)
            mma(s[t], a, b[:, 0], b[:, 1]); mma(s[t+1], a, b[:, 2], b[:, 3])
    return s

def frag_to_a(p, kk):  # accumulators of tiles 2kk, 2kk+1 -> A fragment
    a = np.zeros((32, 4, 2))
    a[:, 0] = p[2*kk][:, 0:2]; a[:, 1] = p[2*kk][:, 2:4]; a[:, 2] = p[2*kk+1][:, 0:2]; a[:, 3] = p[2*kk+1][:, 2:4]
    return a

def warp_pv(o, p, smem, v_base, stride, ntiles, dtiles):
    for kk in range(ntiles // 2):
        a = frag_to_a(p, kk)
        for t in range(0, dtiles, 2):
            b = ldmatrix_x4(smem, [v_base + v_lane_offset(l, stride) + kk*16*stride + t*8 for l in range(32)], True)
            mma(o[t], a, b[:, 0], b[:, 1]); mma(o[t+1], a, b[:, 2], b[:, 3])

def acc_to_matrix(acc, ntiles):  # (ntiles,32,4) -> 16 x 8*ntiles
    M = np.zeros((16, 8 * ntiles))
    for t in range(ntiles):
        for T in range(32):
            g, c = T // 4, 2 * (T % 4)
            M[g, t*8+c:t*8+c+2] = acc[t, T, 0:2]; M[g+8, t*8+c:t*8+c+2] = acc[t, T, 2:4]
    return M

D = 64; S = D + 8; BM = 64; BN = 64; DS = BM + 8; SUB = 32
K = rng.standard_normal((BN, D)); V = rng.standard_normal((BN, D))
Q = rng.standard_normal((BM, D)); dO = rng.standard_normal((BM, D))
# smem layout: k, v, q, dout tiles, then ds
smem = np.zeros(4 * 64 * S + 64 * DS)
kb, vb, qb, dob, dsb = 0, 64*S, 2*64*S, 3*64*S, 4*64*S
for base, X in ((kb, K), (vb, V), (qb, Q), (dob, dO)):
    for r in range(64): smem[base + r*S: base + r*S + D] = X[r]
lse = rng.standard_normal(BM); delta = rng.standard_normal(BM)
P = np.exp(K @ Q.T * 0.1 - lse[None, :])  # P^T (keys x queries), unmasked
dPt = V @ dO.T
dSt = P * (dPt - delta[None, :])
ok = True
dQ = np.zeros((BM, D))
for warp in range(4):
    dk = np.zeros((D//8, 32, 4)); dv = np.zeros((D//8, 32, 4))
    for sub in range(0, BM, SUB):
        pt = warp_qk(smem, kb + 16*warp*S, qb + sub*S, S, SUB//8, D//16)
        St = acc_to_matrix(pt, SUB//8)
        ok &= np.allclose(St, K[16*warp:16*warp+16] @ Q[sub:sub+SUB].T)
        # P from emulated S^T with lse by column (col = sub + t*8 + col0 + (e&1))
        for t in range(SUB//8):
            for T in range(32):
                for e in range(4):
                    col = sub + t*8 + 2*(T % 4) + (e & 1)
                    pt[t, T, e] = np.exp(pt[t, T, e]*0.1 - lse[col])
        warp_pv(dv, pt, smem, dob + v_lane_offset(0, S)*0 + sub*S, S, SUB//8, D//8)
        dst = warp_qk(smem, vb + 16*warp*S, dob + sub*S, S, SUB//8, D//16)
        for t in range(SUB//8):
            for T in range(32):
                for e in range(4):
                    col = sub + t*8 + 2*(T % 4) + (e & 1)
                    dst[t, T, e] = pt[t, T, e] * (dst[t, T, e] - delta[col])
        warp_pv(dk, dst, smem, qb + sub*S, S, SUB//8, D//8)
        for t in range(SUB//8):
            for half in range(2):
                for T in range(32):
                    row = 16*warp + 8*half + T//4
                    c = sub + t*8 + 2*(T % 4)
                    smem[dsb + row*DS + c: dsb + row*DS + c + 2] = dst[t, T, 2*half: 2*half+2]
    ok &= np.allclose(acc_to_matrix(dv, D//8), P[16*warp:16*warp+16] @ dO)
    ok &= np.allclose(acc_to_matrix(dk, D//8), dSt[16*warp:16*warp+16] @ Q)
# dQ after all warps wrote dS^T
for warp in range(4):
    a = [ldmatrix_x4(smem, [dsb + k_lane_offset(l, DS) + 16*warp + kk*16*DS for l in range(32)], True) for kk in range(4)]
    for c in range(0, D//8, 4):
        acc = np.zeros((4, 32, 4))
        for kk in range(4):
            for t in range(0, 4, 2):
                b = ldmatrix_x4(smem, [kb + v_lane_offset(l, S) + kk*16*S + (c+t)*8 for l in range(32)], True)
                mma(acc[t], a[kk], b[:, 0], b[:, 1]); mma(acc[t+1], a[kk], b[:, 2], b[:, 3])
        dQ[16*warp:16*warp+16, c*8:c*8+32] = acc_to_matrix(acc, 4)
ok &= np.allclose(dQ, dSt.T @ K)
# dq kernel: S = Q K^T rows of warp, dQ += dS K via warp_pv with K as B
for warp in range(4):
    s = warp_qk(smem, qb + 16*warp*S, kb, S, BN//8, D//16)
    ok &= np.allclose(acc_to_matrix(s, BN//8), Q[16*warp:16*warp+16] @ K.T)
    dsr = np.zeros_like(s)
    Sm = acc_to_matrix(s, BN//8)
    dS = dSt.T[16*warp:16*warp+16]
    for t in range(BN//8):
        for T in range(32):
            g, c0 = T//4, 2*(T % 4)
            dsr[t, T] = [dS[g, t*8+c0], dS[g, t*8+c0+1], dS[g+8, t*8+c0], dS[g+8, t*8+c0+1]]
    dq = np.zeros((D//8, 32, 4))
    warp_pv(dq, dsr, smem, kb, S, BN//8, D//8)
    ok &= np.allclose(acc_to_matrix(dq, D//8), dS @ K)
print("all fragment maps match:", ok)
