// Fused causal multi-head attention for the CPU, forward and backward, as XLA FFI
// handlers (see cpu_attention.py, which builds and loads this file).
//
// Why: at small head dims (D/H = 4 or 8) XLA materialises the (B, H, T, T) scores,
// probabilities, dropout mask and their gradients in a dozen memory-bound passes, and
// that, not the matmuls, is the cost of a many-head step on a CPU. Here each
// (batch row, head) is one task: scores, softmax, dropout and the value product are done
// row by row in L1, and the backward pass recomputes them from the per-row
// log-sum-exp (FlashAttention-style), so nothing of size T x T is ever stored.
//
// Layout: q, k, v, out: (..., B, T, D) float32, heads (..., 1) int32 (the coarse head
// count H of each member: D/H is the head dim, so one compiled program serves members
// with different H), seeds (..., F, 2) uint32 (dropout seeds of coarse heads 0..F-1),
// lse (..., B, F, T) float32 (rows of heads >= H unused). Leading dims "..." are vmapped
// members (flattened here).
//
// Dropout: keep (b, c, i, j) iff mix(seed_c, b * T + i, j) >> 8 < threshold (24-bit
// uniform < keep_prob), the same function as attention.dropout_keep() in JAX.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr uint32_t kRowMul = 0x9E3779B9u;
constexpr uint32_t kColMul = 0x85EBCA77u;

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// exp(x) for x <= 0 (arguments here are s - max), vectorisable: 2^n * p(r).
inline float fast_exp(float x) {
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Shape {
  int64_t n = 0;       // rows (members x batch)
  int64_t t = 0;       // sequence length
  int64_t d = 0;       // width
  int64_t members = 0; // leading (vmapped) count
  int64_t batch = 0;   // rows per member
  int64_t fine = 0;    // seeds per member (>= every member's heads)
};

ffi::Error GetShape(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::S32>& heads,
                    const ffi::Buffer<ffi::U32>& seeds, Shape* s) {
  auto dims = q.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("q must be (..., T, D)");
  s->t = dims[dims.size() - 2];
  s->d = dims[dims.size() - 1];
  s->n = static_cast<int64_t>(q.element_count()) / std::max<int64_t>(1, s->t * s->d);
  s->members = static_cast<int64_t>(heads.element_count());
  if (s->members <= 0 || s->n % s->members)
    return ffi::Error::InvalidArgument("heads must have one entry per member");
  s->batch = s->n / s->members;
  s->fine = static_cast<int64_t>(seeds.element_count()) / (2 * s->members);
  const int32_t* h = heads.typed_data();
  for (int64_t m = 0; m < s->members; ++m) {
    if (h[m] <= 0 || s->d % h[m] || h[m] > s->fine)
      return ffi::Error::InvalidArgument("heads must divide the width and be <= the seed count");
  }
  return ffi::Error::Success();
}

// Runs fn(item) for item in [0, count) on the caller and the intra-op pool. The caller
// takes part, so this never waits on a pool that is busy running the caller itself.
template <typename Fn>
void ParallelFor(ffi::ThreadPool& pool, int64_t count, Fn fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto work = [state, count, &fn]() {
    int64_t finished = 0;
    for (int64_t i; (i = state->next.fetch_add(1)) < count;) {
      fn(i);
      ++finished;
    }
    if (finished && state->done.fetch_add(finished) + finished == count) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->cv.notify_all();
    }
  };
  int64_t helpers = std::min<int64_t>(pool.num_threads(), count) - 1;
  for (int64_t i = 0; i < helpers; ++i) {
    // Helpers hold the state alive; they only touch `fn` while claiming items, and
    // no item is claimed after the caller has seen all of them done.
    pool.Schedule([state, count, work]() {
      if (state->next.load() < count) work();
    });
  }
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == count; });
}

struct Params {
  const float* q;
  const float* k;
  const float* v;
  const int32_t* heads;
  const uint32_t* seeds;
  Shape s;
  uint32_t threshold;  // keep iff (hash >> 8) < threshold; >= 2^24: no dropout
  float inv_keep;
  bool dropout() const { return threshold < (1u << 24); }
};

constexpr int64_t V = 16;  // vector width in floats; rows are padded to a multiple
constexpr float kNeg = -1e30f;

inline int64_t RoundUp(int64_t x) { return (x + V - 1) / V * V; }

// Per-task scratch, reused across tasks of one thread. Arrays over keys have length
// Tp = RoundUp(T), zero beyond T, so every loop over keys runs whole vectors.
struct Scratch {
  std::vector<float> kt, vt, dkt, dvt, row, prob, mask, qs;
  std::vector<uint32_t> col;
  void Reserve(int64_t tp, int64_t dh) {
    for (auto* x : {&kt, &vt, &dkt, &dvt}) x->assign(dh * tp, 0.0f);
    for (auto* x : {&row, &prob, &mask}) x->assign(tp, 0.0f);
    qs.assign(dh, 0.0f);
    col.resize(tp);
    for (int64_t j = 0; j < tp; ++j) col[j] = static_cast<uint32_t>(j) * kColMul;
  }
};

thread_local Scratch tls;

struct Task {
  int64_t row0;  // first element of this batch row in q: row * T * D
  int64_t col0;  // first column of the head
  int64_t dh;
  int64_t b;     // batch index within the member
  int64_t lse0;  // offset of this (row, head) in lse
  uint32_t s0, s1;
  float scale;
};

inline Task MakeTask(const Params& p, int64_t item, int64_t slots) {
  const Shape& s = p.s;
  int64_t row = item / slots, c = item % slots;
  int64_t member = row / s.batch;
  int64_t h = p.heads[member];
  Task t;
  t.dh = s.d / h;
  t.row0 = row * s.t * s.d;
  t.col0 = c * t.dh;
  t.b = row % s.batch;
  t.lse0 = (row * s.fine + c) * s.t;
  t.s0 = p.seeds[(member * s.fine + c) * 2];
  t.s1 = p.seeds[(member * s.fine + c) * 2 + 1];
  t.scale = 1.0f / std::sqrt(static_cast<float>(t.dh));
  return t;
}

// The head's slice of x (T, D), transposed into xt (dh, Tp).
inline void LoadT(const float* x, const Task& t, int64_t T, int64_t Tp, int64_t D, float* xt) {
  for (int64_t j = 0; j < T; ++j) {
    const float* src = x + t.row0 + j * D + t.col0;
    for (int64_t d = 0; d < t.dh; ++d) xt[d * Tp + j] = src[d];
  }
}

// Scaled scores of query i (qs = q_i * scale) against the keys of one vector block.
inline void ScoreBlock(const float* qs, const float* kt, int64_t Tp, int64_t dh, int64_t jb,
                       float* acc) {
  for (int64_t j = 0; j < V; ++j) acc[j] = 0.0f;
  for (int64_t d = 0; d < dh; ++d) {
    const float qd = qs[d];
    const float* kd = kt + d * Tp + jb;
    for (int64_t j = 0; j < V; ++j) acc[j] += qd * kd[j];
  }
}

// Dropout multipliers (0 or 1/keep) of query i for keys [0, lenp).
inline void Mask(const Params& p, const Task& t, int64_t i, int64_t lenp, const uint32_t* col,
                 float* mask) {
  const uint32_t a = fmix32(static_cast<uint32_t>(t.b * p.s.t + i) * kRowMul + t.s0);
  const uint32_t thr = p.threshold, s1 = t.s1;
  const float inv = p.inv_keep;
  for (int64_t j = 0; j < lenp; ++j) {
    uint32_t h = fmix32((a ^ col[j]) + s1);
    mask[j] = (h >> 8) < thr ? inv : 0.0f;
  }
}

inline float Dot(const float* a, const float* b, int64_t lenp) {
  float acc[V] = {};
  for (int64_t jb = 0; jb < lenp; jb += V)
    for (int64_t j = 0; j < V; ++j) acc[j] += a[jb + j] * b[jb + j];
  float total = 0.0f;
  for (int64_t j = 0; j < V; ++j) total += acc[j];
  return total;
}

void ForwardTask(const Params& p, int64_t item, int64_t slots, float* out, float* lse) {
  const Shape& s = p.s;
  const Task t = MakeTask(p, item, slots);
  if (t.col0 >= s.d) {  // a member with fewer heads than slots: unused lse rows
    std::fill(lse + t.lse0, lse + t.lse0 + s.t, 0.0f);
    return;
  }
  const int64_t T = s.t, Tp = RoundUp(T), D = s.d, dh = t.dh;
  Scratch& w = tls;
  w.Reserve(Tp, dh);
  LoadT(p.k, t, T, Tp, D, w.kt.data());
  LoadT(p.v, t, T, Tp, D, w.vt.data());
  float* row = w.row.data();
  float* mask = w.mask.data();
  float* qs = w.qs.data();
  for (int64_t i = 0; i < T; ++i) {
    const int64_t lenp = RoundUp(i + 1);
    const float* qi = p.q + t.row0 + i * D + t.col0;
    for (int64_t d = 0; d < dh; ++d) qs[d] = qi[d] * t.scale;
    float m = kNeg;
    for (int64_t jb = 0; jb < lenp; jb += V) {
      float acc[V];
      ScoreBlock(qs, w.kt.data(), Tp, dh, jb, acc);
      for (int64_t j = 0; j < V; ++j) {
        const float x = jb + j <= i ? acc[j] : kNeg;
        row[jb + j] = x;
        m = std::max(m, x);
      }
    }
    float l = 0.0f;
    for (int64_t j = 0; j < lenp; ++j) {
      const float e = j <= i ? fast_exp(row[j] - m) : 0.0f;
      row[j] = e;
      l += e;
    }
    lse[t.lse0 + i] = m + std::log(l);
    const float inv_l = 1.0f / l;
    if (p.dropout()) {
      Mask(p, t, i, lenp, w.col.data(), mask);
      for (int64_t j = 0; j < lenp; ++j) row[j] *= inv_l * mask[j];
    } else {
      for (int64_t j = 0; j < lenp; ++j) row[j] *= inv_l;
    }
    float* o = out + t.row0 + i * D + t.col0;
    for (int64_t d = 0; d < dh; ++d) o[d] = Dot(row, w.vt.data() + d * Tp, lenp);
  }
}

void BackwardTask(const Params& p, int64_t item, int64_t slots, const float* out,
                  const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const Shape& s = p.s;
  const Task t = MakeTask(p, item, slots);
  if (t.col0 >= s.d) return;
  const int64_t T = s.t, Tp = RoundUp(T), D = s.d, dh = t.dh;
  Scratch& w = tls;
  w.Reserve(Tp, dh);
  LoadT(p.k, t, T, Tp, D, w.kt.data());
  LoadT(p.v, t, T, Tp, D, w.vt.data());
  float* ds = w.row.data();
  float* pm = w.prob.data();
  float* mask = w.mask.data();
  float* qs = w.qs.data();
  const bool dropout = p.dropout();
  for (int64_t i = 0; i < T; ++i) {
    const int64_t lenp = RoundUp(i + 1);
    const float* qi = p.q + t.row0 + i * D + t.col0;
    const float* gi = dout + t.row0 + i * D + t.col0;
    const float* oi = out + t.row0 + i * D + t.col0;
    float di = 0.0f;
    for (int64_t d = 0; d < dh; ++d) {
      di += gi[d] * oi[d];
      qs[d] = qi[d] * t.scale;
    }
    const float li = lse[t.lse0 + i];
    if (dropout) Mask(p, t, i, lenp, w.col.data(), mask);
    for (int64_t jb = 0; jb < lenp; jb += V) {
      float sc[V], gv[V];
      ScoreBlock(qs, w.kt.data(), Tp, dh, jb, sc);
      ScoreBlock(gi, w.vt.data(), Tp, dh, jb, gv);  // dO_i . v_j
      for (int64_t j = 0; j < V; ++j) {
        const float pr = jb + j <= i ? fast_exp(sc[j] - li) : 0.0f;
        const float mk = dropout ? mask[jb + j] : 1.0f;
        pm[jb + j] = pr * mk;
        ds[jb + j] = pr * (gv[j] * mk - di) * t.scale;
      }
    }
    float* dqi = dq + t.row0 + i * D + t.col0;
    for (int64_t d = 0; d < dh; ++d) {
      dqi[d] = Dot(ds, w.kt.data() + d * Tp, lenp);
      const float qd = qi[d], gd = gi[d];
      float* dkd = w.dkt.data() + d * Tp;
      float* dvd = w.dvt.data() + d * Tp;
      for (int64_t j = 0; j < lenp; ++j) {
        dkd[j] += ds[j] * qd;
        dvd[j] += pm[j] * gd;
      }
    }
  }
  for (int64_t j = 0; j < T; ++j) {
    float* dkj = dk + t.row0 + j * D + t.col0;
    float* dvj = dv + t.row0 + j * D + t.col0;
    for (int64_t d = 0; d < dh; ++d) {
      dkj[d] = w.dkt[d * Tp + j];
      dvj[d] = w.dvt[d * Tp + j];
    }
  }
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> heads,
                   ffi::Buffer<ffi::U32> seeds, ffi::ResultBuffer<ffi::F32> out,
                   ffi::ResultBuffer<ffi::F32> lse, int64_t threshold, float inv_keep) {
  Params p{q.typed_data(), k.typed_data(), v.typed_data(), heads.typed_data(), seeds.typed_data()};
  if (auto e = GetShape(q, heads, seeds, &p.s); e.failure()) return e;
  p.threshold = static_cast<uint32_t>(std::min<int64_t>(threshold, 1 << 24));
  p.inv_keep = inv_keep;
  const int64_t hm = p.s.fine;  // items: every (row, coarse-head slot)
  float* o = out->typed_data();
  float* l = lse->typed_data();
  ParallelFor(pool, p.s.n * hm, [&](int64_t item) { ForwardTask(p, item, hm, o, l); });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                    ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                    ffi::Buffer<ffi::F32> dout, ffi::Buffer<ffi::S32> heads,
                    ffi::Buffer<ffi::U32> seeds, ffi::ResultBuffer<ffi::F32> dq,
                    ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv,
                    int64_t threshold, float inv_keep) {
  Params p{q.typed_data(), k.typed_data(), v.typed_data(), heads.typed_data(), seeds.typed_data()};
  if (auto e = GetShape(q, heads, seeds, &p.s); e.failure()) return e;
  p.threshold = static_cast<uint32_t>(std::min<int64_t>(threshold, 1 << 24));
  p.inv_keep = inv_keep;
  const int64_t hm = p.s.fine;  // items: every (row, coarse-head slot)
  const float* o = out.typed_data();
  const float* l = lse.typed_data();
  const float* g = dout.typed_data();
  float* a = dq->typed_data();
  float* b = dk->typed_data();
  float* c = dv->typed_data();
  ParallelFor(pool, p.s.n * hm, [&](int64_t item) { BackwardTask(p, item, hm, o, l, g, a, b, c); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MhjaxAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threshold")
                                  .Attr<float>("inv_keep"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MhjaxAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threshold")
                                  .Attr<float>("inv_keep"));
