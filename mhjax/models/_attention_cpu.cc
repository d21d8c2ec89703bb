// Fused causal multi-head attention for the CPU, forward and backward, as XLA FFI
// handlers (see cpu_attention.py, which builds and loads this file).
//
// Why: XLA materialises the (B, H, T, T) scores, probabilities, dropout mask and their
// gradients in a dozen memory-bound passes, and runs the small per-head matmuls (head
// dim 4 to 64) far below the machine's peak; that is most of a many-head step on a CPU.
// Here each (batch row, head) is one task: scores, softmax, dropout and the value product
// are done for blocks of R queries in L1 (each key/value vector loaded serves R rows),
// with explicit 16-float vectors, and the backward pass recomputes them from the per-row
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

// Explicit 16-float vectors (GCC/Clang vector extensions): one AVX-512 register, or two
// or four narrower ones; written out because the compiler would not vectorise the
// blocked loops below by itself (aliasing through the scratch buffers).
constexpr int64_t V = 16;  // vector width in floats; rows are padded to a multiple
constexpr int64_t R = 4;   // queries per block: each key/value vector loaded feeds R rows
constexpr float kNeg = -1e30f;
typedef float vf __attribute__((vector_size(4 * V)));
typedef int32_t vi __attribute__((vector_size(4 * V)));
typedef uint32_t vu __attribute__((vector_size(4 * V)));
const vi kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline vf Load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf Splat(float x) { return vf{} + x; }
inline vf Select(vi keep, vf a, vf b) { return (vf)(((vi)a & keep) | ((vi)b & ~keep)); }
inline float Sum(vf v) {
  float total = 0.0f;
  for (int64_t j = 0; j < V; ++j) total += v[j];
  return total;
}
inline vf Max(vf a, vf b) { return Select(a > b, a, b); }

// exp(x) for x <= 0 (arguments here are s - max): 2^n * p(r). n = round(x / ln 2) as
// trunc(x / ln 2 - 0.5), exact for x <= 0 (the 1.5 * 2^23 trick would be folded away
// under -fassociative-math).
inline vf Exp(vf x) {
  x = Max(x, Splat(-87.0f));
  const vi ni = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);
  const vf n = __builtin_convertvector(ni, vf);
  const vf r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  vf p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (ni + 127) << 23;
  return p * (vf)bits;
}

inline vu Fmix32(vu h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

inline int64_t RoundUp(int64_t x) { return (x + V - 1) / V * V; }

// Per-task scratch, reused across tasks of one thread. Arrays over keys have length
// Tp = RoundUp(T), zero beyond T, so every loop over keys runs whole vectors; per-row
// arrays hold R rows of Tp. Allocated (zeroed) only when the shape changes: tasks write
// kt/vt below T only, and every other array before reading it, except the dk/dv
// accumulators, which the backward pass zeroes per task.
struct Scratch {
  std::vector<float> kt, vt, dkt, dvt, row, prob, mask, qs, acc;
  std::vector<uint32_t> col;
  int64_t tp = -1, dh = -1;
  void Reserve(int64_t tp_, int64_t dh_) {
    if (tp_ == tp && dh_ == dh) return;
    tp = tp_;
    dh = dh_;
    for (auto* x : {&kt, &vt, &dkt, &dvt}) x->assign(dh * tp, 0.0f);
    for (auto* x : {&row, &prob, &mask}) x->assign(R * tp, 0.0f);
    qs.assign(R * dh, 0.0f);
    acc.assign(R * dh, 0.0f);
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

// The head's slice of x (T, D), transposed into xt (dh, Tp), zero beyond T. Gathers a
// vector of keys per d and stores it whole: scalar stores at stride Tp stalled (perf: a
// third of the forward pass).
inline void LoadT(const float* x, const Task& t, int64_t T, int64_t Tp, int64_t D, float* xt) {
  const float* src = x + t.row0 + t.col0;
  for (int64_t d = 0; d < t.dh; ++d) {
    for (int64_t jb = 0; jb < Tp; jb += V) {
      vf block{};
      const int64_t n = std::min<int64_t>(V, T - jb);
      for (int64_t j = 0; j < n; ++j) block[j] = src[(jb + j) * D + d];
      Store(xt + d * Tp + jb, block);
    }
  }
}

// a[r] = sum_d x[r][d] * yt[d][jb : jb + V] for NR rows (x: NR x dh, yt: dh x Tp): one
// load of yt per d feeds NR rows.
template <int NR>
inline void ScoreBlock(const float* x, const float* yt, int64_t Tp, int64_t dh, int64_t jb, vf* a) {
  for (int r = 0; r < NR; ++r) a[r] = vf{};
  for (int64_t d = 0; d < dh; ++d) {
    const vf yd = Load(yt + d * Tp + jb);
    for (int r = 0; r < NR; ++r) a[r] += x[r * dh + d] * yd;
  }
}

// Dropout multipliers (0 or 1/keep) of query i for keys [0, lenp).
inline void Mask(const Params& p, const Task& t, int64_t i, int64_t lenp, const uint32_t* col,
                 float* mask) {
  const uint32_t a = fmix32(static_cast<uint32_t>(t.b * p.s.t + i) * kRowMul + t.s0);
  const vf inv = Splat(p.inv_keep);
  for (int64_t jb = 0; jb < lenp; jb += V) {
    vu c;
    std::memcpy(&c, col + jb, sizeof(c));
    const vu h = Fmix32((c ^ a) + t.s1);
    Store(mask + jb, Select((vi)((h >> 8) < p.threshold), inv, vf{}));
  }
}

inline float Dot(const float* a, const float* b, int64_t lenp) {
  vf acc{};
  for (int64_t jb = 0; jb < lenp; jb += V) acc += Load(a + jb) * Load(b + jb);
  return Sum(acc);
}

// y[r][0:dh] = sum_{j < n} w[r][j] * x_j[0:dh], x_j = x + j * D (row-major, stride D), for
// NR rows of w (stride Tp). Vectorised over the head dim: used when dh is a multiple of V
// (else the transposed Dot form, vectorised over keys, is used).
template <int NR>
inline void RowCombine(const float* w, int64_t Tp, const float* x, int64_t D, int64_t n,
                       int64_t dh, float* y) {
  for (int64_t db = 0; db < dh; db += V) {
    vf a[NR] = {};
    for (int64_t j = 0; j < n; ++j) {
      const vf xj = Load(x + j * D + db);
      for (int r = 0; r < NR; ++r) a[r] += w[r * Tp + j] * xj;
    }
    for (int r = 0; r < NR; ++r) Store(y + r * dh + db, a[r]);
  }
}

// Queries i0 .. i0 + NR - 1 of one (row, head).
template <int NR>
void ForwardRows(const Params& p, const Task& t, int64_t i0, Scratch& w, float* out, float* lse) {
  const int64_t T = p.s.t, Tp = RoundUp(T), D = p.s.d, dh = t.dh;
  const int64_t last = i0 + NR - 1, lenp = RoundUp(last + 1);
  float* qs = w.qs.data();
  for (int r = 0; r < NR; ++r) {
    const float* qi = p.q + t.row0 + (i0 + r) * D + t.col0;
    for (int64_t d = 0; d < dh; ++d) qs[r * dh + d] = qi[d] * t.scale;
  }
  vf m[NR];
  for (int r = 0; r < NR; ++r) m[r] = Splat(kNeg);
  for (int64_t jb = 0; jb < lenp; jb += V) {
    vf a[NR];
    ScoreBlock<NR>(qs, w.kt.data(), Tp, dh, jb, a);
    const vi j = kIota + static_cast<int32_t>(jb);
    for (int r = 0; r < NR; ++r) {
      const vf x = Select(j <= static_cast<int32_t>(i0 + r), a[r], Splat(kNeg));
      Store(w.row.data() + r * Tp + jb, x);
      m[r] = Max(m[r], x);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const int64_t i = i0 + r;
    float* row = w.row.data() + r * Tp;
    float mr = kNeg;
    for (int64_t j = 0; j < V; ++j) mr = std::max(mr, m[r][j]);
    vf l{};
    for (int64_t jb = 0; jb < lenp; jb += V) {
      const vi j = kIota + static_cast<int32_t>(jb);
      const vf e = Select(j <= static_cast<int32_t>(i), Exp(Load(row + jb) - mr), vf{});
      Store(row + jb, e);
      l += e;
    }
    const float total = Sum(l);
    lse[t.lse0 + i] = mr + std::log(total);
    const float inv_l = 1.0f / total;
    if (p.dropout()) {
      float* mask = w.mask.data();
      Mask(p, t, i, lenp, w.col.data(), mask);
      for (int64_t jb = 0; jb < lenp; jb += V) Store(row + jb, Load(row + jb) * inv_l * Load(mask + jb));
    } else {
      for (int64_t jb = 0; jb < lenp; jb += V) Store(row + jb, Load(row + jb) * inv_l);
    }
  }
  if (dh % V == 0) {
    float* y = w.acc.data();
    RowCombine<NR>(w.row.data(), Tp, p.v + t.row0 + t.col0, D, last + 1, dh, y);
    for (int r = 0; r < NR; ++r)
      std::memcpy(out + t.row0 + (i0 + r) * D + t.col0, y + r * dh, dh * sizeof(float));
  } else {
    for (int r = 0; r < NR; ++r) {
      float* o = out + t.row0 + (i0 + r) * D + t.col0;
      for (int64_t d = 0; d < dh; ++d) o[d] = Dot(w.row.data() + r * Tp, w.vt.data() + d * Tp, lenp);
    }
  }
}

void ForwardTask(const Params& p, int64_t item, int64_t slots, float* out, float* lse) {
  const Shape& s = p.s;
  const Task t = MakeTask(p, item, slots);
  if (t.col0 >= s.d) {  // a member with fewer heads than slots: unused lse rows
    std::fill(lse + t.lse0, lse + t.lse0 + s.t, 0.0f);
    return;
  }
  const int64_t T = s.t, Tp = RoundUp(T), D = s.d;
  Scratch& w = tls;
  w.Reserve(Tp, t.dh);
  LoadT(p.k, t, T, Tp, D, w.kt.data());
  if (t.dh % V) LoadT(p.v, t, T, Tp, D, w.vt.data());
  int64_t i = 0;
  for (; i + R <= T; i += R) ForwardRows<R>(p, t, i, w, out, lse);
  for (; i < T; ++i) ForwardRows<1>(p, t, i, w, out, lse);
}

template <int NR>
void BackwardRows(const Params& p, const Task& t, int64_t i0, Scratch& w, const float* out,
                  const float* lse, const float* dout, float* dq) {
  const int64_t T = p.s.t, Tp = RoundUp(T), D = p.s.d, dh = t.dh;
  const int64_t last = i0 + NR - 1, lenp = RoundUp(last + 1);
  const bool dropout = p.dropout();
  float* qs = w.qs.data();
  float* gs = w.acc.data();  // dO rows
  float di[NR], li[NR];
  for (int r = 0; r < NR; ++r) {
    const int64_t i = i0 + r;
    const float* qi = p.q + t.row0 + i * D + t.col0;
    const float* gi = dout + t.row0 + i * D + t.col0;
    const float* oi = out + t.row0 + i * D + t.col0;
    di[r] = 0.0f;
    for (int64_t d = 0; d < dh; ++d) {
      di[r] += gi[d] * oi[d];
      qs[r * dh + d] = qi[d] * t.scale;
      gs[r * dh + d] = gi[d];
    }
    li[r] = lse[t.lse0 + i];
    if (dropout) Mask(p, t, i, lenp, w.col.data(), w.mask.data() + r * Tp);
  }
  for (int64_t jb = 0; jb < lenp; jb += V) {
    vf sc[NR], gv[NR];
    ScoreBlock<NR>(qs, w.kt.data(), Tp, dh, jb, sc);
    ScoreBlock<NR>(gs, w.vt.data(), Tp, dh, jb, gv);  // dO_i . v_j
    const vi j = kIota + static_cast<int32_t>(jb);
    for (int r = 0; r < NR; ++r) {
      const vf pr = Select(j <= static_cast<int32_t>(i0 + r), Exp(sc[r] - li[r]), vf{});
      const vf mk = dropout ? Load(w.mask.data() + r * Tp + jb) : Splat(1.0f);
      Store(w.prob.data() + r * Tp + jb, pr * mk);
      Store(w.row.data() + r * Tp + jb, pr * (gv[r] * mk - di[r]) * t.scale);
    }
  }
  // dk_j += sum_r ds[r][j] q_r, dv_j += sum_r pm[r][j] dO_r (transposed accumulators).
  for (int64_t d = 0; d < dh; ++d) {
    float qd[NR], gd[NR];
    for (int r = 0; r < NR; ++r) {
      qd[r] = p.q[t.row0 + (i0 + r) * D + t.col0 + d];
      gd[r] = gs[r * dh + d];
    }
    float* dkd = w.dkt.data() + d * Tp;
    float* dvd = w.dvt.data() + d * Tp;
    for (int64_t jb = 0; jb < lenp; jb += V) {
      vf k = Load(dkd + jb), v = Load(dvd + jb);
      for (int r = 0; r < NR; ++r) {
        k += Load(w.row.data() + r * Tp + jb) * qd[r];
        v += Load(w.prob.data() + r * Tp + jb) * gd[r];
      }
      Store(dkd + jb, k);
      Store(dvd + jb, v);
    }
  }
  if (dh % V == 0) {
    RowCombine<NR>(w.row.data(), Tp, p.k + t.row0 + t.col0, D, last + 1, dh, gs);
    for (int r = 0; r < NR; ++r)
      std::memcpy(dq + t.row0 + (i0 + r) * D + t.col0, gs + r * dh, dh * sizeof(float));
  } else {
    for (int r = 0; r < NR; ++r) {
      float* dqi = dq + t.row0 + (i0 + r) * D + t.col0;
      for (int64_t d = 0; d < dh; ++d) dqi[d] = Dot(w.row.data() + r * Tp, w.kt.data() + d * Tp, lenp);
    }
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
  std::fill(w.dkt.begin(), w.dkt.end(), 0.0f);
  std::fill(w.dvt.begin(), w.dvt.end(), 0.0f);
  LoadT(p.k, t, T, Tp, D, w.kt.data());
  LoadT(p.v, t, T, Tp, D, w.vt.data());
  int64_t i = 0;
  for (; i + R <= T; i += R) BackwardRows<R>(p, t, i, w, out, lse, dout, dq);
  for (; i < T; ++i) BackwardRows<1>(p, t, i, w, out, lse, dout, dq);
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
