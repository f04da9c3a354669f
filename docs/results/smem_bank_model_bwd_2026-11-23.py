# Model of the backward kernel's shared-memory accesses (flash_backward.cu at 2419a91, D = 128,
# bf16): run with python3; prints wavefronts against the ideal per access kind for one CTA step.
# Bank-conflict check of the backward kernel's shared-memory accesses (D=128, bf16), from the
# address formulas in flash_backward.cu. Shared memory: 32 banks x 4 B; a 16-B-per-lane access
# (ldmatrix row, cp.async) is served 8 lanes (128 B) per wavefront ideally.
kDim, kBlockN, kBlockM = 128, 64, 64
def sw(row, chunk, width):  # element offset
    return row * width + ((chunk ^ (row & 7)) << 3)
def wavefronts16(addrs):  # byte addresses of 16-B accesses, in lane order, grouped 8 per phase
    total = 0
    for ph in range(0, len(addrs), 8):
        banks = {}
        for a in addrs[ph:ph+8]:
            for w in range(4):
                word = a // 4 + w
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(v) for v in banks.values())
    return total
def wavefronts4(addrs):
    banks = {}
    for a in addrs:
        banks.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(v) for v in banks.values())
E = 2
res = {}
def rec(name, got, ideal):
    r = res.setdefault(name, [0, 0]); r[0] += got; r[1] += ideal
for warp in range(4):
    # S/dP: Q/dO ldmatrix (non-trans), K/V ldmatrix
    for ks in range(kDim // 16):
        # ldmatrix x4: lane l supplies row address for matrix l//8
        a = [sw(warp*16 + (l % 16), ks*2 + l // 16, kDim) * E for l in range(32)]
        rec("ldsm Q/dO", wavefronts16(a), 4)
        for jp in range(kBlockN // 16):
            a = [sw(jp*16 + (l//16)*8 + (l % 8), ks*2 + (l//8) % 2, kDim) * E for l in range(32)]
            rec("ldsm K/V", wavefronts16(a), 4)
    # P/dS stores
    for j in range(kBlockN // 8):
        for r in range(2):
            a = [(0x18000 + (sw(warp*16 + (l//4) + 8*r, j, kBlockN) + 2*(l % 4)) * E) for l in range(32)]
            rec("sts P/dS", wavefronts4(a), 1)
    # dV/dK: P/dS trans loads, dO/Q trans loads
    for kk in range(kBlockM // 16):
        a = [sw(kk*16 + ((l//8)//2)*8 + (l % 8), warp*2 + (l//8) % 2, kBlockN) * E for l in range(32)]
        rec("ldsm.t P/dS", wavefronts16(a), 4)
        for dpair in range(kDim // 16):
            a = [sw(kk*16 + (l % 8) + ((l//8) % 2)*8, dpair*2 + l//16, kDim) * E for l in range(32)]
            rec("ldsm.t dO/Q", wavefronts16(a), 4)
    # dQ: K trans loads
    for dpair in range(kDim // 16):
        for ks in range(kBlockN // 16):
            a = [sw(ks*16 + (l % 8) + ((l//8) % 2)*8, dpair*2 + l//16, kDim) * E for l in range(32)]
            rec("ldsm.t K", wavefronts16(a), 4)
# cp.async tile loads: 64 rows x 16 chunks, thread t handles c = t + 128 i
kChunks = kDim // 8
for i in range(64 * kChunks // 128):
    for warp in range(4):
        a = []
        for l in range(32):
            c = warp*32 + l + 128*i
            a.append(sw(c // kChunks, c % kChunks, kDim) * E)
        rec("cp.async tile", wavefronts16(a), 4)
for k, (got, ideal) in res.items():
    print(f"{k:16s} wavefronts {got:6d} ideal {ideal:6d} excess {got-ideal}")
