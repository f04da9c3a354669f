// hopper_bwd_test.cu: the standalone check and benchmark driver for the sm_90a BACKWARD kernel in
// hopper_bwd.cuh (the lab in dev/hopper_attention/; see README.md).
//   check: small problems (odd lengths, S_q != S_k, causal and full, GQA 4:2 and 4:1, B = 2, rows
//          with no key, accumulation into existing gradients) against a CPU fp64 oracle under the
//          project's bf16 rule, for dQ, dK and dV each:
//            max|ours - oracle| <= 2 * max|plain - oracle| + max|round_bf16(oracle) - oracle|
//          "plain" is the project's plain low-precision attention (tests/test_util.cpp,
//          plain_lowp_attention, re-implemented here step for step: inputs bf16, fp32 sums,
//          S, P, O, dP, dS and every output rounded to bf16). Our kernel is given what a bf16
//          forward hands the backward: the oracle's LSE in fp32 and its O rounded to bf16 (D is
//          computed from them by our preprocessing kernel). Outputs are poisoned with NaN first.
//          Then the masks the kernels take as visible-tile lists (lab_masks.hpp: documents of
//          random lengths with 1-token ones, windows, block patterns; GQA, odd lengths, rows with
//          no key), the oracle evaluating the mask element by element.
//   bench: B = 1 problems with uniform [-1, 1) inputs; O and LSE from our forward kernel; times
//          the whole backward (zeroing the dQ accumulator, preprocessing, main kernel, dQ
//          conversion) and the main kernel alone, with CUDA events (median). FLOPs = 2.5 x
//          4 B S^2 H D (half for causal).
//   benchmask: the same for a mask spec (lab_masks.hpp), FLOPs = 2.5 x 4 B H D x visible scores.
// Variants (variants.cuh, kBwdVariants): 0 base, 1 defer, 2 memset, 3 sfirst, 4 q128 (D = 64),
// 5 q80 (D = 128: 80-row query tiles, hopper_bwd_q80.cuh), 6 short64 (D = 128: 64-key tiles, one
// consumer, two CTAs per SM, hopper_bwd_short.cuh; lists per 64-key tile), 7 q80h and 8 q128h (q80 and
// q128 with the dense grid's key tiles heaviest first, K/V heads inner).
// Usage: hopper_bwd_test check [D] [variant[,variant...]|both] [all|dense|masks]
//          (default: base and defer on the same inputs; masked cases run those of the given
//          variants that take lists, base and q128, else base)
//        hopper_bwd_test selftest          (CPU only: the oracle against finite differences)
//        hopper_bwd_test bench <S> <causal 0|1> <H> <Hkv> <D> [reps] [variant number]
//        hopper_bwd_test benchmask <S> <mask spec> <H> <Hkv> <D> [reps] [variant number]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lab_tiles.cuh"  // visible-tile lists of the lab's masks
#include "variants.cuh"   // the library's kernels (src/kernels/hopper/)

using hopper_attn::BwdArgs;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                                       \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

static inline float bf16r(double x) { return __bfloat162float(__float2bfloat16(static_cast<float>(x))); }

struct Case {
  int B, H, Hkv, Sq, Sk, D, causal, offset, accumulate;
  const char* mask = nullptr;  // a lab_masks.hpp spec (run as tile lists; causal unused), or none
};

template <class F>
static void parallel_for(int n, const F& fn) {
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < nt; ++t)
    pool.emplace_back([&, t] {
      for (int r = t; r < n; r += nt) fn(r);
    });
  for (auto& th : pool) th.join();
}

static void fill_uniform(std::vector<__nv_bfloat16>& x, std::vector<float>& xf, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = __float2bfloat16(u(rng));
    xf[i] = __bfloat162float(x[i]);
  }
}

// Oracle (fp64) and plain (bf16 rule's baseline) gradients of one case.
struct Grads {
  std::vector<double> dq, dk, dv;  // oracle
  std::vector<double> pq, pk, pv;  // plain (already rounded to bf16)
  std::vector<float> lse;          // oracle LSE in fp32 (what our kernel is given)
  std::vector<__nv_bfloat16> o;    // oracle O rounded to bf16 (what our kernel is given)
};

static Grads reference(const Case& c, const std::vector<float>& Q, const std::vector<float>& K,
                       const std::vector<float>& V, const std::vector<float>& dO, const lab::PairMask* pm = nullptr) {
  const int B = c.B, H = c.H, Hkv = c.Hkv, Sq = c.Sq, Sk = c.Sk, D = c.D, G = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  const size_t nq = size_t(B) * Sq * H * D, nk = size_t(B) * Sk * Hkv * D;
  Grads g;
  g.dq.assign(nq, 0.0);
  g.pq.assign(nq, 0.0);
  g.dk.assign(nk, 0.0);
  g.dv.assign(nk, 0.0);
  g.pk.assign(nk, 0.0);
  g.pv.assign(nk, 0.0);
  g.lse.assign(size_t(B) * H * Sq, 0.f);
  g.o.assign(nq, __float2bfloat16(0.f));
  // Per (b, h, i) row: P and dS rows of the oracle (fp64) and of plain (fp32), for the key pass.
  std::vector<double> P(size_t(B) * H * Sq * Sk), dS(size_t(B) * H * Sq * Sk);
  std::vector<float> pP(size_t(B) * H * Sq * Sk), pdS(size_t(B) * H * Sq * Sk);
  auto q_at = [&](const std::vector<float>& X, int b, int i, int h) { return &X[((size_t(b) * Sq + i) * H + h) * D]; };
  auto k_at = [&](const std::vector<float>& X, int b, int j, int gh) {
    return &X[((size_t(b) * Sk + j) * Hkv + gh) * D];
  };
  auto visible = [&](int i, int j) {
    return pm ? lab::allows(*pm, pm->q0 + i, pm->k0 + j) : !c.causal || j <= i + c.offset;
  };

  parallel_for(B * H * Sq, [&](int r) {
    const int i = r % Sq, h = (r / Sq) % H, b = r / (Sq * H), gh = h / G;
    const float* q = q_at(Q, b, i, h);
    const float* dout = q_at(dO, b, i, h);
    double* Pr = &P[size_t(r) * Sk];
    double* dSr = &dS[size_t(r) * Sk];
    float* pPr = &pP[size_t(r) * Sk];
    float* pdSr = &pdS[size_t(r) * Sk];
    std::vector<double> s(Sk, -INFINITY);
    std::vector<float> sp(Sk, -INFINITY);
    double m = -INFINITY;
    float mp = -INFINITY;
    for (int j = 0; j < Sk; ++j) {
      Pr[j] = dSr[j] = 0;
      pPr[j] = pdSr[j] = 0;
      if (!visible(i, j)) continue;
      const float* k = k_at(K, b, j, gh);
      double acc = 0;
      float accf = 0;
      for (int d = 0; d < D; ++d) {
        acc += double(q[d]) * double(k[d]);
        accf += q[d] * k[d];
      }
      s[j] = acc * scale;
      sp[j] = bf16r(double(accf) * scale);
      m = std::max(m, s[j]);
      mp = std::max(mp, sp[j]);
    }
    const size_t li = (size_t(b) * H + h) * Sq + i;
    if (m == -INFINITY) {  // no key: LSE = -inf, O = 0, no gradient anywhere
      g.lse[li] = -INFINITY;
      return;
    }
    double l = 0;
    float lp = 0;
    for (int j = 0; j < Sk; ++j)
      if (s[j] != -INFINITY) {
        l += std::exp(s[j] - m);
        lp += std::exp(sp[j] - mp);
      }
    const double lse = m + std::log(l);
    g.lse[li] = float(lse);
    std::vector<double> o(D, 0.0);
    std::vector<float> op(D, 0.f);
    for (int j = 0; j < Sk; ++j) {
      if (s[j] == -INFINITY) continue;
      Pr[j] = std::exp(s[j] - lse);
      pPr[j] = bf16r(std::exp(sp[j] - mp) / lp);
      const float* v = k_at(V, b, j, gh);
      for (int d = 0; d < D; ++d) {
        o[d] += Pr[j] * v[d];
        op[d] += pPr[j] * v[d];
      }
    }
    double delta = 0;
    float deltap = 0;
    for (int d = 0; d < D; ++d) {
      g.o[((size_t(b) * Sq + i) * H + h) * D + d] = __float2bfloat16(float(o[d]));
      delta += double(dout[d]) * o[d];
      deltap += dout[d] * bf16r(op[d]);
    }
    std::vector<double> dq(D, 0.0);
    std::vector<float> dqp(D, 0.f);
    for (int j = 0; j < Sk; ++j) {
      if (s[j] == -INFINITY) continue;
      const float* v = k_at(V, b, j, gh);
      const float* k = k_at(K, b, j, gh);
      double dpv = 0;
      float dpp = 0;
      for (int d = 0; d < D; ++d) {
        dpv += double(dout[d]) * v[d];
        dpp += dout[d] * v[d];
      }
      dpp = bf16r(dpp);
      dSr[j] = Pr[j] * (dpv - delta);
      pdSr[j] = bf16r(pPr[j] * (dpp - deltap));
      for (int d = 0; d < D; ++d) {
        dq[d] += dSr[j] * k[d];
        dqp[d] += pdSr[j] * k[d];
      }
    }
    for (int d = 0; d < D; ++d) {
      g.dq[((size_t(b) * Sq + i) * H + h) * D + d] = dq[d] * scale;
      g.pq[((size_t(b) * Sq + i) * H + h) * D + d] = bf16r(dqp[d] * scale);
    }
  });
  // Key pass: dK, dV of (b, kv head, key j), summed over the group's heads (head-major, then
  // rows, the order plain_lowp_attention adds in).
  parallel_for(B * Hkv * Sk, [&](int r) {
    const int j = r % Sk, gh = (r / Sk) % Hkv, b = r / (Sk * Hkv);
    std::vector<double> dk(D, 0.0), dv(D, 0.0);
    std::vector<float> dkp(D, 0.f), dvp(D, 0.f);
    for (int h = gh * G; h < (gh + 1) * G; ++h)
      for (int i = 0; i < Sq; ++i) {
        const size_t e = ((size_t(b) * H + h) * Sq + i) * Sk + j;
        if (!visible(i, j)) continue;
        const float* q = q_at(Q, b, i, h);
        const float* dout = q_at(dO, b, i, h);
        for (int d = 0; d < D; ++d) {
          dk[d] += dS[e] * q[d];
          dv[d] += P[e] * dout[d];
          dkp[d] += pdS[e] * q[d];
          dvp[d] += pP[e] * dout[d];
        }
      }
    for (int d = 0; d < D; ++d) {
      const size_t o = ((size_t(b) * Sk + j) * Hkv + gh) * D + d;
      g.dk[o] = dk[d] * scale;
      g.dv[o] = dv[d];
      g.pk[o] = bf16r(dkp[d] * scale);
      g.pv[o] = bf16r(dvp[d]);
    }
  });
  return g;
}

struct Err {
  double ours = 0, plain = 0, floor = 0;
  long nan = 0;
  bool ok() const { return nan == 0 && ours <= 2 * plain + floor; }
};

static Err compare(const std::vector<__nv_bfloat16>& ours, const std::vector<double>& oracle,
                   const std::vector<double>& plain) {
  Err e;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double x = __bfloat162float(ours[i]);
    if (!std::isfinite(x)) {
      ++e.nan;
      continue;
    }
    e.ours = std::max(e.ours, std::abs(x - oracle[i]));
    e.plain = std::max(e.plain, std::abs(plain[i] - oracle[i]));
    e.floor = std::max(e.floor, std::abs(double(bf16r(oracle[i])) - oracle[i]));
  }
  return e;
}

static bool check_case(const Case& c, uint64_t seed, const std::vector<int>& variants) {
  std::mt19937_64 rng(seed);
  const size_t nq = size_t(c.B) * c.Sq * c.H * c.D, nk = size_t(c.B) * c.Sk * c.Hkv * c.D;
  std::vector<__nv_bfloat16> q(nq), k(nk), v(nk), dout(nq), dq(nq), dk(nk), dv(nk);
  std::vector<float> qf(nq), kf(nk), vf(nk), dof(nq);
  fill_uniform(q, qf, rng);
  fill_uniform(k, kf, rng);
  fill_uniform(v, vf, rng);
  fill_uniform(dout, dof, rng);
  lab::PairMask pm;
  if (c.mask && !lab::make_mask(c.mask, c.Sq, c.Sk, c.offset, seed, &pm)) {
    std::fprintf(stderr, "unknown mask %s\n", c.mask);
    std::exit(2);
  }
  Grads g = reference(c, qf, kf, vf, dof, c.mask ? &pm : nullptr);
  // Accumulating: start from random bf16 gradients; the expected result adds them.
  std::vector<__nv_bfloat16> dq0(nq), dk0(nk), dv0(nk);
  if (c.accumulate) {
    std::vector<float> t0(nq), t1(nk), t2(nk);
    fill_uniform(dq0, t0, rng);
    fill_uniform(dk0, t1, rng);
    fill_uniform(dv0, t2, rng);
    for (size_t i = 0; i < nq; ++i) {
      g.dq[i] += t0[i];
      g.pq[i] = bf16r(g.pq[i] + t0[i]);
    }
    for (size_t i = 0; i < nk; ++i) {
      g.dk[i] += t1[i];
      g.pk[i] = bf16r(g.pk[i] + t1[i]);
      g.dv[i] += t2[i];
      g.pv[i] = bf16r(g.pv[i] + t2[i]);
    }
  }
  void *d_q, *d_k, *d_v, *d_o, *d_do, *d_dq, *d_dk, *d_dv, *ws;
  float* d_lse;
  const size_t wsb = hopper_attn::lab_workspace_bytes(c.B, c.H, c.Sq, c.D);
  CK(cudaMalloc(&d_q, nq * 2));
  CK(cudaMalloc(&d_k, nk * 2));
  CK(cudaMalloc(&d_v, nk * 2));
  CK(cudaMalloc(&d_o, nq * 2));
  CK(cudaMalloc(&d_do, nq * 2));
  CK(cudaMalloc(&d_dq, nq * 2));
  CK(cudaMalloc(&d_dk, nk * 2));
  CK(cudaMalloc(&d_dv, nk * 2));
  CK(cudaMalloc(&d_lse, g.lse.size() * 4));
  CK(cudaMalloc(&ws, wsb));
  CK(cudaMemcpy(d_q, q.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_k, k.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_v, v.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_o, g.o.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_do, dout.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_lse, g.lse.data(), g.lse.size() * 4, cudaMemcpyHostToDevice));
  BwdArgs a{};
  a.q = d_q;
  a.k = d_k;
  a.v = d_v;
  a.o = d_o;
  a.dout = d_do;
  a.lse = d_lse;
  a.delta = nullptr;
  a.dq = d_dq;
  a.dk = d_dk;
  a.dv = d_dv;
  a.workspace = ws;
  a.batch = c.B;
  a.heads = c.H;
  a.kv_heads = c.Hkv;
  a.seq_q = c.Sq;
  a.seq_k = c.Sk;
  a.head_dim = c.D;
  a.causal = c.causal;
  a.causal_offset = c.offset;
  a.accumulate = c.accumulate;
  long empty = 0;
  for (float l : g.lse) empty += l == -INFINITY;
  bool all_ok = true;
  for (int variant : variants) {
  // The lists are made with the variant's query tile (the forward's tiles are not used here).
  lab::DeviceTiles tiles;
  if (c.mask) {
    tiles = lab::upload_tiles(pm, 128, 192, hopper_attn::bwd_query_rows(variant), hopper_attn::bwd_key_tile(variant));
    a.tiles = tiles.bwd;
  }
  // Poison: the launcher must zero the dQ accumulator itself, and an unwritten bf16 output
  // (0xFFFF is NaN) fails.
  CK(cudaMemset(ws, 0xFF, wsb));
  if (c.accumulate) {
    CK(cudaMemcpy(d_dq, dq0.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dk, dk0.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dv, dv0.data(), nk * 2, cudaMemcpyHostToDevice));
  } else {
    CK(cudaMemset(d_dq, 0xFF, nq * 2));
    CK(cudaMemset(d_dk, 0xFF, nk * 2));
    CK(cudaMemset(d_dv, 0xFF, nk * 2));
  }
  a.variant = variant;
  CK(hopper_attn::dispatch_bwd(a, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(dq.data(), d_dq, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dk.data(), d_dk, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dv.data(), d_dv, nk * 2, cudaMemcpyDeviceToHost));

  const Err eq = compare(dq, g.dq, g.pq), ek = compare(dk, g.dk, g.pk), ev = compare(dv, g.dv, g.pv);
  const bool ok = eq.ok() && ek.ok() && ev.ok();
  auto ratio = [](const Err& e) { return e.ours / (2 * e.plain + e.floor); };
  std::printf(
      "%-4s %-5s D=%3d B=%d H=%d Hkv=%d Sq=%5d Sk=%5d %s off=%4d acc=%d | dQ %.3e (plain %.3e, floor %.3e, %.2f of "
      "bound) | dK %.3e (plain %.3e, %.2f) | dV %.3e (plain %.3e, %.2f) | nan %ld/%ld/%ld, empty rows %ld\n",
      ok ? "PASS" : "FAIL", hopper_attn::kBwdVariants[variant], c.D, c.B, c.H, c.Hkv, c.Sq, c.Sk,
      c.mask ? c.mask : c.causal ? "causal" : "full  ", c.offset, c.accumulate,
      eq.ours, eq.plain, eq.floor, ratio(eq), ek.ours, ek.plain, ratio(ek), ev.ours, ev.plain, ratio(ev), eq.nan,
      ek.nan, ev.nan, empty);
  std::fflush(stdout);
  all_ok = all_ok && ok;
  if (c.mask)
    std::printf("     tiles: %lld listed (key side), %lld boundary\n", tiles.entries[1], tiles.boundary[1]);
  tiles.release();
  }
  for (void* p : {d_q, d_k, d_v, d_o, d_do, d_dq, d_dk, d_dv, static_cast<void*>(d_lse), ws}) CK(cudaFree(p));
  return all_ok;
}

// Masked cases (B, H, Hkv, Sq, Sk, D, -, offset, accumulate, mask); see hopper_fwd_test.cu's.
static std::vector<Case> mask_cases() {
  return {
      {1, 2, 2, 1000, 1000, 128, 0, 0, 0, "docs"},         {2, 4, 2, 777, 777, 128, 0, 0, 0, "docs:7"},
      {1, 4, 1, 1000, 1000, 128, 0, 0, 0, "docsfull"},     {1, 2, 2, 1100, 1100, 128, 0, 0, 0, "window:256,0"},
      {1, 2, 2, 777, 900, 128, 0, -150, 0, "window:100,20"}, {1, 2, 2, 1000, 1000, 128, 0, 0, 0, "bigbirdc:64"},
      {1, 4, 2, 900, 1000, 128, 0, 0, 0, "bigbird:32"},    {1, 2, 2, 1000, 1000, 128, 0, 0, 0, "bigbirdc:8"},
      {1, 2, 2, 640, 640, 128, 0, -200, 0, "docs"},        {1, 4, 2, 777, 777, 128, 0, 0, 1, "docs:5"},
      {1, 2, 2, 1000, 1000, 64, 0, 0, 0, "docs"},          {2, 4, 2, 777, 777, 64, 0, 0, 0, "window:200,0"},
      {1, 2, 1, 1000, 1000, 64, 0, 0, 0, "bigbirdc:16"},   {1, 2, 2, 640, 640, 64, 0, -200, 0, "docs:3"},
  };
}

static int run_check(int only_d, const std::vector<int>& variants, const std::string& which) {
  // B, H, Hkv, Sq, Sk, D, causal, offset, accumulate
  std::vector<Case> cases = {
      {1, 2, 2, 256, 256, 128, 0, 0, 0},     {1, 2, 2, 256, 256, 128, 1, 0, 0},
      {2, 4, 2, 1000, 1000, 128, 1, 0, 0},   {2, 4, 2, 1000, 1000, 128, 0, 0, 0},
      {1, 4, 1, 777, 777, 128, 0, 0, 0},     {2, 4, 1, 777, 777, 128, 1, 0, 0},
      {1, 2, 2, 300, 1100, 128, 0, 0, 0},    {1, 2, 2, 1100, 300, 128, 1, 0, 0},
      {1, 2, 2, 300, 1100, 128, 1, 500, 0},  {1, 2, 1, 640, 640, 128, 1, -200, 0},
      {1, 2, 2, 129, 100, 128, 0, 0, 0},     {1, 4, 2, 777, 777, 128, 1, 0, 1},
      {1, 2, 2, 256, 256, 64, 0, 0, 0},      {2, 4, 2, 1000, 1000, 64, 1, 0, 0},
      {1, 4, 1, 777, 777, 64, 0, 0, 0},      {1, 2, 1, 640, 640, 64, 1, -200, 0},
      {2, 4, 1, 777, 777, 64, 1, 0, 0},      {1, 2, 2, 1100, 300, 64, 1, 0, 0},
      {1, 2, 2, 300, 1100, 64, 1, 500, 0},   {1, 2, 2, 129, 100, 64, 0, 0, 0},
      {1, 4, 2, 777, 777, 64, 1, 0, 1},
  };
  if (which == "masks") cases.clear();
  const size_t n_dense = cases.size();
  if (which != "dense")
    for (const Case& c : mask_cases()) cases.push_back(c);
  int fails = 0, n = 0;
  uint64_t seed = 0xb3d00000ull + std::random_device{}();  // fresh inputs every run
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (only_d && c.D != only_d) continue;
    ++n;
    // Masked cases run the variants that take lists and run at this D (base, q128, q80); else base.
    std::vector<int> run;
    for (int v : variants)
      if (hopper_attn::bwd_variant_runs(v, c.D) && (i < n_dense || ((v == 0 || v >= 4) && hopper_attn::bwd_variant_lists(v))))
        run.push_back(v);
    if (run.empty()) run.push_back(0);
    fails += !check_case(c, seed++, run);
  }
  std::string names;
  for (int v : variants) names += std::string(names.empty() ? "" : ",") + hopper_attn::kBwdVariants[v];
  std::printf("check bwd D=%d variants %s: %d/%d cases pass\n", only_d, names.c_str(), n - fails, n);
  return fails ? 1 : 0;
}

// Uniform [-1, 1) bf16 on the device (a hash per element).
__global__ void fill_kernel(__nv_bfloat16* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

static int run_bench(int S, int causal, int H, int Hkv, int D, int reps, int variant, const char* mask = nullptr) {
  const int B = 1;
  const size_t nq = size_t(B) * S * H * D, nk = size_t(B) * S * Hkv * D;
  __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  void* ws;
  CK(cudaMalloc(&q, nq * 2));
  CK(cudaMalloc(&k, nk * 2));
  CK(cudaMalloc(&v, nk * 2));
  CK(cudaMalloc(&o, nq * 2));
  CK(cudaMalloc(&dout, nq * 2));
  CK(cudaMalloc(&dq, nq * 2));
  CK(cudaMalloc(&dk, nk * 2));
  CK(cudaMalloc(&dv, nk * 2));
  CK(cudaMalloc(&lse, size_t(B) * H * S * 4));
  CK(cudaMalloc(&ws, hopper_attn::lab_workspace_bytes(B, H, S, D)));
  fill_kernel<<<1024, 256>>>(q, nq, 1);
  fill_kernel<<<1024, 256>>>(k, nk, 2);
  fill_kernel<<<1024, 256>>>(v, nk, 3);
  fill_kernel<<<1024, 256>>>(dout, nq, 4);
  CK(cudaGetLastError());
  hopper_attn::FwdArgs f{};
  f.q = q;
  f.k = k;
  f.v = v;
  f.o = o;
  f.lse = lse;
  f.batch = B;
  f.heads = H;
  f.kv_heads = Hkv;
  f.seq_q = S;
  f.seq_k = S;
  f.head_dim = D;
  f.causal = causal;
  lab::PairMask pm;
  lab::DeviceTiles tiles;
  const char* fwd_variant = D == 128 ? "pp192" : "m192";
  if (mask) {
    if (!lab::mask_tiles(mask, S, S, 0, 12345, fwd_variant, D, &pm, &tiles, hopper_attn::bwd_query_rows(variant),
                         hopper_attn::bwd_key_tile(variant)))
      return 2;
    f.tiles = tiles.fwd;
  }
  CK(hopper_attn::dispatch(fwd_variant, f, 0));
  BwdArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.dout = dout;
  a.lse = lse;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.workspace = ws;
  a.batch = B;
  a.heads = H;
  a.kv_heads = Hkv;
  a.seq_q = S;
  a.seq_k = S;
  a.head_dim = D;
  a.causal = causal;
  a.variant = variant;
  a.tiles = tiles.bwd;
  for (int i = 0; i < 2; ++i) CK(hopper_attn::dispatch_bwd(a, 0));
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0]));
  for (int r = 0; r < reps; ++r) {
    CK(hopper_attn::dispatch_bwd(a, 0));
    CK(cudaEventRecord(ev[r + 1]));
  }
  CK(cudaEventSynchronize(ev[reps]));
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) CK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
  std::sort(ms.begin(), ms.end());
  const double med = ms[reps / 2];
  const double flops =
      mask ? 2.5 * 4.0 * B * tiles.visible * H * D : 2.5 * 4.0 * B * double(S) * S * H * D * (causal ? 0.5 : 1.0);
  if (mask)
    std::printf("BENCHMASK bwd variant=%d S=%d mask=%s H=%d Hkv=%d D=%d visible=%.4g (%.3f of full) tiles=%lld boundary=%lld "
                "ms=%.3f (min %.3f max %.3f) TFLOPs=%.1f\n",
                variant, S, mask, H, Hkv, D, tiles.visible, tiles.visible / (double(S) * S), tiles.entries[1],
                tiles.boundary[1], med, ms[0], ms[reps - 1], flops / (med * 1e-3) / 1e12);
  else
  std::printf("BENCH bwd variant=%d S=%d causal=%d H=%d Hkv=%d D=%d ms=%.3f (min %.3f max %.3f) TFLOPs=%.1f\n", variant, S, causal, H,
              Hkv, D, med, ms[0], ms[reps - 1], flops / (med * 1e-3) / 1e12);
  // The main kernel alone (the rest: zeroing the dQ accumulator, preprocessing, dQ conversion).
  a.main_only = 1;
  CK(cudaEventRecord(ev[0]));
  for (int r = 0; r < reps; ++r) {
    CK(hopper_attn::dispatch_bwd(a, 0));
    CK(cudaEventRecord(ev[r + 1]));
  }
  CK(cudaEventSynchronize(ev[reps]));
  for (int r = 0; r < reps; ++r) CK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
  std::sort(ms.begin(), ms.end());
  const double med_main = ms[reps / 2];
  std::printf("BENCH bwd variant=%d S=%d causal=%d main kernel only ms=%.3f TFLOPs=%.1f (the rest %.3f ms)\n", variant,
              S, causal, med_main, flops / (med_main * 1e-3) / 1e12, med - med_main);
  // Everything but the main kernel (zeroing, preprocessing, dQ conversion), timed on its own with
  // 4x the repetitions: the backward's fixed cost (issue 34, item 1).
  a.main_only = 2;
  const int reps_fixed = 4 * reps;
  std::vector<cudaEvent_t> evf(reps_fixed + 1);
  for (auto& e : evf) CK(cudaEventCreate(&e));
  for (int i = 0; i < 3; ++i) CK(hopper_attn::dispatch_bwd(a, 0));
  CK(cudaEventRecord(evf[0]));
  for (int r = 0; r < reps_fixed; ++r) {
    CK(hopper_attn::dispatch_bwd(a, 0));
    CK(cudaEventRecord(evf[r + 1]));
  }
  CK(cudaEventSynchronize(evf[reps_fixed]));
  std::vector<float> msf(reps_fixed);
  for (int r = 0; r < reps_fixed; ++r) CK(cudaEventElapsedTime(&msf[r], evf[r], evf[r + 1]));
  std::sort(msf.begin(), msf.end());
  std::printf("FIXED bwd variant=%s S=%d causal=%d H=%d D=%d fixed (memset + preprocess + convert) ms=%.4f (min %.4f max "
              "%.4f) = %.1f%% of the whole\n",
              hopper_attn::kBwdVariants[variant], S, causal, H, D, msf[reps_fixed / 2], msf[0], msf[reps_fixed - 1],
              100.0 * msf[reps_fixed / 2] / med);
  for (auto& e : evf) CK(cudaEventDestroy(e));
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                  static_cast<void*>(dout), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                  static_cast<void*>(lse), ws})
    CK(cudaFree(p));
  tiles.release();
  return 0;
}

// CPU-only self-test of the oracle (no GPU): central finite differences of L = sum(dO * O),
// computed in fp64, against the oracle's dQ, dK, dV at a few elements, and the plain
// baseline's distance from the oracle. Run here, where there is no GPU, before spending
// device time.
static double loss64(const Case& c, const std::vector<float>& Q, const std::vector<float>& K,
                     const std::vector<float>& V, const std::vector<float>& dO, int which, size_t idx, double eps) {
  const int G = c.H / c.Hkv, D = c.D;
  const double scale = 1.0 / std::sqrt(double(D));
  auto val = [&](int w, const std::vector<float>& X, size_t i) { return double(X[i]) + (w == which && i == idx ? eps : 0.0); };
  double L = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.Sq; ++i) {
        std::vector<double> s(c.Sk, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          if (c.causal && j > i + c.offset) continue;
          double a = 0;
          for (int d = 0; d < D; ++d)
            a += val(0, Q, ((size_t(b) * c.Sq + i) * c.H + h) * D + d) * val(1, K, ((size_t(b) * c.Sk + j) * c.Hkv + h / G) * D + d);
          s[j] = a * scale;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        for (int j = 0; j < c.Sk; ++j) if (s[j] != -INFINITY) l += std::exp(s[j] - m);
        for (int j = 0; j < c.Sk; ++j) {
          if (s[j] == -INFINITY) continue;
          const double pj = std::exp(s[j] - m) / l;
          for (int d = 0; d < D; ++d)
            L += pj * val(2, V, ((size_t(b) * c.Sk + j) * c.Hkv + h / G) * D + d) * dO[((size_t(b) * c.Sq + i) * c.H + h) * D + d];
        }
      }
  return L;
}

static int run_selftest() {
  const Case c{2, 4, 2, 37, 29, 16, 1, 3, 0};
  std::mt19937_64 rng(7);
  const size_t nq = size_t(c.B) * c.Sq * c.H * c.D, nk = size_t(c.B) * c.Sk * c.Hkv * c.D;
  std::vector<__nv_bfloat16> q(nq), k(nk), v(nk), dout(nq);
  std::vector<float> qf(nq), kf(nk), vf(nk), dof(nq);
  fill_uniform(q, qf, rng);
  fill_uniform(k, kf, rng);
  fill_uniform(v, vf, rng);
  fill_uniform(dout, dof, rng);
  const Grads g = reference(c, qf, kf, vf, dof);
  double worst = 0;
  const double eps = 1e-5;
  for (int which = 0; which < 3; ++which) {
    const size_t n = which == 0 ? nq : nk;
    const std::vector<double>& ref = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
    const std::vector<float>& X = which == 0 ? qf : which == 1 ? kf : vf;
    for (size_t t = 0; t < 40; ++t) {
      const size_t idx = (t * 7919 + 13) % n;
      const double fd = (loss64(c, qf, kf, vf, dof, which, idx, eps) - loss64(c, qf, kf, vf, dof, which, idx, -eps)) / (2 * eps);
      worst = std::max(worst, std::abs(fd - ref[idx]));
      (void)X;
    }
  }
  double pq = 0, pk = 0, pv = 0, mq = 0;
  for (size_t i = 0; i < nq; ++i) { pq = std::max(pq, std::abs(g.pq[i] - g.dq[i])); mq = std::max(mq, std::abs(g.dq[i])); }
  for (size_t i = 0; i < nk; ++i) { pk = std::max(pk, std::abs(g.pk[i] - g.dk[i])); pv = std::max(pv, std::abs(g.pv[i] - g.dv[i])); }
  std::printf("selftest: oracle vs finite differences max err %.3e (max |dQ| %.3e); plain vs oracle dQ %.3e dK %.3e dV %.3e\n",
              worst, mq, pq, pk, pv);
  return worst < 1e-6 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "selftest") return run_selftest();
  if (argc >= 2 && std::string(argv[1]) == "check") {
    std::vector<int> variants = {0, 1};
    if (argc >= 4 && std::string(argv[3]) != "both") {
      variants.clear();
      std::string list = argv[3];
      for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string name = list.substr(at, end - at);
        variants.push_back(hopper_attn::bwd_variant(name));
        if (variants.back() < 0) {
          std::fprintf(stderr, "no backward variant %s\n", name.c_str());
          return 2;
        }
        at = end + 1;
      }
    }
    return run_check(argc >= 3 ? std::atoi(argv[2]) : 0, variants, argc >= 5 ? argv[4] : "all");
  }
  if (argc >= 7 && std::string(argv[1]) == "benchmask")
    return run_bench(std::atoi(argv[2]), 0, std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                     argc >= 8 ? std::atoi(argv[7]) : 10, argc >= 9 ? std::atoi(argv[8]) : 0, argv[3]);
  if (argc >= 7 && std::string(argv[1]) == "bench")
    return run_bench(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                     std::atoi(argv[6]), argc >= 8 ? std::atoi(argv[7]) : 10, argc >= 9 ? std::atoi(argv[8]) : 0);
  std::fprintf(stderr,
               "usage: %s check [D] [base|defer|memset|sfirst|both] [all|dense|masks]\n       %s bench <S> "
               "<causal> <H> <Hkv> <D> [reps] [variant number]\n       %s benchmask <S> <mask> <H> <Hkv> <D> [reps] "
               "[variant number]\n",
               argv[0], argv[0], argv[0]);
  return 2;
}
