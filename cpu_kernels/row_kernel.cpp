// Product of a few float32 rows (a decode step's one, a short prompt's) with weights kept in blocks of unsigned
// codes, read in the layout cpu_kernels/quantized.py packs them: int32 words (in / 32, bits, out), 4-, 5-, 6- or 8-bit
// codes (the low nibbles of 4/5/6-bit codes in words 0-3, their top bits in the words after: `pack_codes`), scale
// and minimum (in / block, out), a block 32 or 16 codes; weight = scale * (code - offset) + minimum.
//
// As llama.cpp does, the row is quantised per block of 32 and each block's codes meet it in integer
// multiply-adds (pairs of int16 products summed into int32 lanes: AVX2 madd, or AVX-512 VNNI's dpwssd, which
// also accumulates), the block's integer sum, less offset times the sum of the row's codes (exact in integers),
// then scaled by both scales in float32. Unlike llama.cpp's 8 bits, the row gets 16 (scale amax / 32767):
// SmolLM2's rows have outliers that leave the other inputs of their block a few levels of 8 bits, which moved its
// logits by up to 2.7 and changed greedy tokens; at 16 bits they move by ~0.01 and the tokens are the float
// path's, at no measured cost in speed (madd takes int16 pairs either way). The vectors run across 8 or 16
// outputs, not along a row: the layout puts the outputs' words side by side, so one broadcast of two activations
// serves a whole vector of outputs and every load is a full vector. The minimum term uses the exact float sum of
// the block's inputs. Threads split the outputs (at::parallel_for: torch's intra-op pool, so never more threads
// than torch uses), each streaming its columns block by block; several rows share each read and unpacking of a
// block.
//
// Built for AVX2 + FMA, or for AVX-512 with VNNI where the CPU has it (flags chosen by cpu_kernels/library.py, which
// checks the CPU at run time): the same code on vectors of 8 or 16 int32 lanes (the wrappers below), with the
// same sums in the same order per output, so both builds give equal results.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// Vectors of int32 and float32 lanes, one output per lane.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
using ivec = __m512i;
using fvec = __m512;
constexpr int64_t kLanes = 16;
inline ivec iload(const int32_t* p) { return _mm512_loadu_si512(p); }
inline ivec iset(int32_t v) { return _mm512_set1_epi32(v); }
inline ivec izero() { return _mm512_setzero_si512(); }
inline ivec iadd(ivec a, ivec b) { return _mm512_add_epi32(a, b); }
inline ivec isub(ivec a, ivec b) { return _mm512_sub_epi32(a, b); }
inline ivec iand(ivec a, ivec b) { return _mm512_and_si512(a, b); }
inline ivec ior(ivec a, ivec b) { return _mm512_or_si512(a, b); }
inline ivec shr(ivec a, int n) { return _mm512_srli_epi32(a, n); }
inline ivec shl(ivec a, int n) { return _mm512_slli_epi32(a, n); }
inline ivec madd_add(ivec acc, ivec a, ivec b) { return _mm512_dpwssd_epi32(acc, a, b); }
inline fvec fload(const float* p) { return _mm512_loadu_ps(p); }
inline void fstore(float* p, fvec v) { _mm512_storeu_ps(p, v); }
inline fvec fset(float v) { return _mm512_set1_ps(v); }
inline fvec fmul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
inline fvec fadd(fvec a, fvec b) { return _mm512_add_ps(a, b); }
inline fvec fsub(fvec a, fvec b) { return _mm512_sub_ps(a, b); }
inline fvec ffma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
inline fvec tofloat(ivec a) { return _mm512_cvtepi32_ps(a); }
inline float fsum(fvec v) { return _mm512_reduce_add_ps(v); }
#else
using ivec = __m256i;
using fvec = __m256;
constexpr int64_t kLanes = 8;
inline ivec iload(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline ivec iset(int32_t v) { return _mm256_set1_epi32(v); }
inline ivec izero() { return _mm256_setzero_si256(); }
inline ivec iadd(ivec a, ivec b) { return _mm256_add_epi32(a, b); }
inline ivec isub(ivec a, ivec b) { return _mm256_sub_epi32(a, b); }
inline ivec iand(ivec a, ivec b) { return _mm256_and_si256(a, b); }
inline ivec ior(ivec a, ivec b) { return _mm256_or_si256(a, b); }
inline ivec shr(ivec a, int n) { return _mm256_srli_epi32(a, n); }
inline ivec shl(ivec a, int n) { return _mm256_slli_epi32(a, n); }
inline ivec madd_add(ivec acc, ivec a, ivec b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
inline fvec fload(const float* p) { return _mm256_loadu_ps(p); }
inline void fstore(float* p, fvec v) { _mm256_storeu_ps(p, v); }
inline fvec fset(float v) { return _mm256_set1_ps(v); }
inline fvec fmul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
inline fvec fadd(fvec a, fvec b) { return _mm256_add_ps(a, b); }
inline fvec fsub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
inline fvec ffma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
inline fvec tofloat(ivec a) { return _mm256_cvtepi32_ps(a); }
inline float fsum(fvec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

constexpr int64_t kBlock = 32;
constexpr float kLimit = 32767.f;  // activations' codes: 16 bits
constexpr int64_t kPatterns = 16;  // broadcast int32 patterns per block
constexpr int64_t kTile = 16;  // rows that share one read of the weights: their outputs stay in L2

// The row quantised per block of 32 to 16 bits, as int16 pairs in the orders the kernels broadcast: for nibble
// codes pattern (b, 4w + s) holds inputs 8w+s and 8w+s+4 (nibbles s and s+4 of word w), for 8-bit codes (b, w)
// holds inputs 4w and 4w+2 (bytes 0 and 2) and (b, 8 + w) inputs 4w+1 and 4w+3. Sums are per block of the
// weights (16 or 32 inputs).
struct QuantRow {
  std::vector<int32_t> codes;  // the quantised row itself, for the outputs past the last multiple of 8
  std::vector<int32_t> patterns;
  std::vector<float> step;  // amax / 32767 of each block of 32
  std::vector<float> sum;   // exact float sum of each weight block's inputs, for the minimum
  std::vector<int32_t> qsum;  // sum of each weight block's codes, for the offset
};

QuantRow quantise_row(const float* x, int64_t blocks, int bits, int halves) {
  QuantRow row;
  row.codes.resize(blocks * kBlock);
  row.patterns.resize(blocks * kPatterns);
  row.step.resize(blocks);
  row.sum.assign(blocks * halves, 0.f);
  row.qsum.assign(blocks * halves, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    int32_t* q = row.codes.data() + b * kBlock;
    float amax = 0.f;
    for (int j = 0; j < kBlock; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      row.sum[b * halves + j * halves / kBlock] += xb[j];
    }
    // A NaN or infinite input makes its block's step NaN (codes 0), so every output is NaN, as in float.
    const bool finite = std::isfinite(row.sum[b * halves]) && std::isfinite(row.sum[b * halves + halves - 1]);
    const float step = finite ? amax / kLimit : std::numeric_limits<float>::quiet_NaN();
    const float inv = step > 0.f ? 1.f / step : 0.f;
    for (int j = 0; j < kBlock; ++j) {
      q[j] = static_cast<int32_t>(std::nearbyint(xb[j] * inv));
      row.qsum[b * halves + j * halves / kBlock] += q[j];
    }
    row.step[b] = step;
    int32_t* p = row.patterns.data() + b * kPatterns;
    auto pair16 = [](int32_t a, int32_t c) {
      return static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(c)) << 16) |
                                  static_cast<uint16_t>(a));
    };
    for (int i = 0; i < kPatterns; ++i) {
      const int a = bits == 8 ? 4 * (i % 8) + i / 8 : 8 * (i / 4) + i % 4;
      p[i] = pair16(q[a], q[a + (bits == 8 ? 2 : 4)]);
    }
  }
  return row;
}

// Vector i of one block's codes for a vector of outputs (wb: the block's first word of them), int16 pairs that
// meet broadcast pattern i of the row (`QuantRow`) in one madd. Nibble codes: nibbles s and s + 4 of word w land
// in the two int16 halves of its lane (shift by 4s, mask 0x000F000F), their top bits shifted in from the high
// words: vector 4w + s. 8 bits: the even and odd bytes of word w, zero-extended to int16: vectors w and 8 + w.
template <int kBits>
inline ivec code_vector(const int32_t* wb, int64_t out, int i) {
  if constexpr (kBits == 8) {
    const ivec v = iload(wb + (i % 8) * out);
    return iand(i < 8 ? v : shr(v, 8), iset(0x00FF00FF));
  } else {
    constexpr int kHigh = kBits - 4, kPer = kHigh ? 16 / kHigh : 1;  // top bits per code, pairs per high word
    ivec codes = iand(shr(iload(wb + (i / 4) * out), 4 * (i % 4)), iset(0x000F000F));
    if constexpr (kHigh > 0) {
      const ivec high = shr(iload(wb + (4 + i / kPer) * out), kHigh * (i % kPer));
      codes = ior(codes, shl(iand(high, iset(((1 << kHigh) - 1) * 0x10001)), 4));
    }
    return codes;
  }
}

// The integer sums of a block's code vectors (`codes(i)`) against one row's patterns: inputs 0-15 of the block
// into acc[0], 16-31 into acc[1]; they stay below 2^31.
template <int kBits, class Codes>
inline void block_sums(const Codes& codes, const int32_t* p, ivec* acc) {
#pragma GCC unroll 16
  for (int i = 0; i < kPatterns; ++i) {
    const int half = kBits == 8 ? (i % 8) / 4 : i / 8;
    acc[half] = madd_add(acc[half], codes(i), iset(p[i]));
  }
}

// Code j of one output's block, for the outputs past the last multiple of 8.
int32_t code_at(const int32_t* words, int64_t out, int64_t b, int64_t o, int j, int bits) {
  auto field = [&](int word, int shift, int width) {
    return static_cast<int32_t>((static_cast<uint32_t>(words[(b * bits + word) * out + o]) >> shift) & ((1u << width) - 1));
  };
  if (bits == 8) return field(j / 4, 8 * (j % 4), 8);
  const int high = bits - 4, w = j / 8, i = j % 8, k = 4 * w + i % 4, per = high ? 16 / high : 1;
  const int32_t low = field(w, 4 * i, 4);
  return high ? low | (field(4 + k / per, 16 * (i / 4) + high * (k % per), high) << 4) : low;
}

struct Matrix {
  const int32_t* words;
  const float* scale;
  const float* minimum;  // or nullptr
  int64_t blocks, out, halves, offset;  // halves: weight blocks per 32 inputs (1, or 2 for blocks of 16)
};

// One block's integer sums for a vector of outputs of one row, less offset times the sum of the row's codes,
// scaled by both scales, plus minimum times the row's exact block sum, added to the row's outputs yr.
inline void add_block(ivec* acc, const QuantRow& row, const Matrix& m, int64_t b, int64_t o, float* yr) {
  if (m.halves == 1) acc[0] = iadd(acc[0], acc[1]);
  fvec yv = fload(yr);
  for (int64_t h = 0, q = b * m.halves; h < m.halves; ++h, ++q) {
    const ivec ints = isub(acc[h], iset(static_cast<int32_t>(m.offset * row.qsum[q])));
    yv = ffma(tofloat(ints), fmul(fload(m.scale + q * m.out + o), fset(row.step[b])), yv);
    if (m.minimum) yv = ffma(fload(m.minimum + q * m.out + o), fset(row.sum[q]), yv);
  }
  fstore(yr, yv);
}

// Outputs [begin, end) of every row, y (rows, out). Several rows (a prefill, a speculative check) unpack each
// block's codes once per tile of rows; one row (a decode step) unpacks them as the madds go, in registers.
template <int kBits>
void columns(const std::vector<QuantRow>& rows, const Matrix& m, int64_t begin, int64_t end, float* y) {
  const int64_t vec_end = begin + (end - begin) / kLanes * kLanes, width = kBlock / m.halves;
  const int64_t n = static_cast<int64_t>(rows.size());
  for (int64_t r0 = 0; r0 < n; r0 += kTile) {
    const int64_t r1 = std::min(n, r0 + kTile);
    for (int64_t b = 0; b < m.blocks; ++b) {
      for (int64_t o = begin; o < vec_end; o += kLanes) {
        const int32_t* wb = m.words + b * kBits * m.out + o;
        const int32_t* p = rows[r0].patterns.data() + b * kPatterns;
        ivec acc[2] = {izero(), izero()};
        if (r1 - r0 == 1) {
          block_sums<kBits>([&](int i) { return code_vector<kBits>(wb, m.out, i); }, p, acc);
          add_block(acc, rows[r0], m, b, o, y + r0 * m.out + o);
          continue;
        }
        ivec codes[kPatterns];
        for (int i = 0; i < kPatterns; ++i) codes[i] = code_vector<kBits>(wb, m.out, i);
        for (int64_t r = r0; r < r1; ++r) {
          acc[0] = acc[1] = izero();
          block_sums<kBits>([&](int i) { return codes[i]; }, rows[r].patterns.data() + b * kPatterns, acc);
          add_block(acc, rows[r], m, b, o, y + r * m.out + o);
        }
      }
      for (int64_t o = vec_end; o < end; ++o) {
        for (int64_t r = r0; r < r1; ++r) {
          const QuantRow& row = rows[r];
          for (int64_t h = 0, q = b * m.halves; h < m.halves; ++h, ++q) {
            int32_t ints = -static_cast<int32_t>(m.offset) * row.qsum[q];
            for (int64_t j = h * width; j < (h + 1) * width; ++j)
              ints += code_at(m.words, m.out, b, o, static_cast<int>(j), kBits) * row.codes[b * kBlock + j];
            y[r * m.out + o] += static_cast<float>(ints) * (m.scale[q * m.out + o] * row.step[b]);
            if (m.minimum) y[r * m.out + o] += m.minimum[q * m.out + o] * row.sum[q];
          }
        }
      }
    }
  }
}

at::Tensor row_product(const at::Tensor& x, const at::Tensor& words, const at::Tensor& scale,
                       const std::optional<at::Tensor>& minimum, int64_t offset) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && words.scalar_type() == at::kInt && scale.scalar_type() == at::kFloat,
              "row_product: float32 rows and scales, int32 words");
  TORCH_CHECK(words.dim() == 3, "row_product: words (in / 32, bits, out)");
  const int64_t blocks = words.size(0), bits = words.size(1), out = words.size(2);
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "row_product: 4-, 5-, 6- or 8-bit codes, got ", bits);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == blocks * kBlock, "row_product: rows of ", blocks * kBlock, " inputs");
  const int64_t halves = scale.dim() == 2 ? scale.size(0) / std::max<int64_t>(1, blocks) : 0;
  TORCH_CHECK((halves == 1 || halves == 2) && scale.sizes() == at::IntArrayRef({blocks * halves, out}),
              "row_product: scale (in / 32 or in / 16, out)");
  const at::Tensor xc = x.contiguous(), wc = words.contiguous(), sc = scale.contiguous();
  at::Tensor mc;
  if (minimum.has_value() && minimum->defined()) {
    mc = minimum->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kFloat && mc.sizes() == sc.sizes(), "row_product: minimum like scale");
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());  // each thread zeroes its own outputs below
  const int64_t n = x.numel() / (blocks * kBlock);
  std::vector<QuantRow> rows(n);
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      rows[r] = quantise_row(xc.data_ptr<float>() + r * blocks * kBlock, blocks, static_cast<int>(bits),
                             static_cast<int>(halves));
  });
  const Matrix m{wc.data_ptr<int32_t>(), sc.data_ptr<float>(), mc.defined() ? mc.data_ptr<float>() : nullptr,
                 blocks, out, halves, offset};
  float* yp = y.data_ptr<float>();
  // Groups of a vector of outputs; a thread's share is at least ~32 KB of words times rows, so a small product stays on
  // one thread.
  const int64_t groups = (out + kLanes - 1) / kLanes;
  const int64_t group_work = blocks * bits * 4 * kLanes * n;
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, group_work));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t begin = g0 * kLanes, end = std::min(out, g1 * kLanes);
    for (int64_t r = 0; r < n; ++r) std::fill(yp + r * out + begin, yp + r * out + end, 0.f);
    switch (bits) {
      case 4: return columns<4>(rows, m, begin, end, yp);
      case 5: return columns<5>(rows, m, begin, end, yp);
      case 6: return columns<6>(rows, m, begin, end, yp);
      default: return columns<8>(rows, m, begin, end, yp);
    }
  });
  return y;
}

// Outputs [start, stop) of the weight in float32, transposed: (in, stop - start), the layout of the words, so each
// store is a vector of outputs. The products of many rows (a long prompt, QLoRA's forward and backward) multiply
// it a group of outputs at a time (cpu_kernels/quantized.py `_product`), each written into the same buffer, where
// unpacking the codes in torch passed over several fresh int32 copies of it. Each weight is (code - offset) * scale + minimum in float32,
// rounded after each operation as torch's path does (the library is built with -ffp-contract=off, so the compiler
// fuses no multiply-add the code does not ask for: the tests compare the two bit for bit).
template <int kBits>
void weight_columns(const Matrix& m, int64_t b, int64_t start, int64_t stop, float* w) {
  const int64_t n = stop - start, vec_end = start + (stop - start) / kLanes * kLanes;
  const fvec offset = fset(static_cast<float>(m.offset));
  for (int64_t o = start; o < vec_end; o += kLanes) {
    const int32_t* wb = m.words + b * kBits * m.out + o;
    for (int i = 0; i < kPatterns; ++i) {
      const ivec pair = code_vector<kBits>(wb, m.out, i);
      const int lo = kBits == 8 ? 4 * (i % 8) + i / 8 : 8 * (i / 4) + i % 4, step = kBits == 8 ? 2 : 4;
      for (int half = 0; half < 2; ++half) {
        const int j = lo + half * step;  // the input of the block
        const int64_t q = b * m.halves + j * m.halves / kBlock;
        const ivec code = half ? shr(pair, 16) : iand(pair, iset(0xFFFF));
        fvec v = fmul(fsub(tofloat(code), offset), fload(m.scale + q * m.out + o));
        if (m.minimum) v = fadd(v, fload(m.minimum + q * m.out + o));
        fstore(w + (b * kBlock + j) * n + (o - start), v);
      }
    }
  }
  for (int64_t o = vec_end; o < stop; ++o) {
    for (int j = 0; j < kBlock; ++j) {
      const int64_t q = b * m.halves + j * m.halves / kBlock;
      float v = (static_cast<float>(code_at(m.words, m.out, b, o, j, kBits)) - static_cast<float>(m.offset)) *
                m.scale[q * m.out + o];
      if (m.minimum) v = v + m.minimum[q * m.out + o];
      w[(b * kBlock + j) * n + (o - start)] = v;
    }
  }
}

// Writes outputs [start, start + n) of the weight into w (in, n), a float32 buffer the caller owns: a product of
// many rows reuses one for every group of outputs, so it is not page-faulted in again for each.
void dequantize_rows(const at::Tensor& words, const at::Tensor& scale, const std::optional<at::Tensor>& minimum,
                     int64_t offset, int64_t start, const at::Tensor& w) {
  TORCH_CHECK(words.scalar_type() == at::kInt && scale.scalar_type() == at::kFloat && words.dim() == 3,
              "dequantize_rows: int32 words (in / 32, bits, out), float32 scales");
  const int64_t blocks = words.size(0), bits = words.size(1), out = words.size(2);
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "dequantize_rows: 4-, 5-, 6- or 8-bit codes");
  const int64_t halves = scale.dim() == 2 ? scale.size(0) / std::max<int64_t>(1, blocks) : 0;
  TORCH_CHECK((halves == 1 || halves == 2) && scale.sizes() == at::IntArrayRef({blocks * halves, out}),
              "dequantize_rows: scale (in / 32 or in / 16, out)");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 2 && w.size(0) == blocks * kBlock,
              "dequantize_rows: a contiguous float32 buffer (in, outputs)");
  const int64_t stop = start + w.size(1);
  TORCH_CHECK(0 <= start && stop <= out, "dequantize_rows: outputs [", start, ", ", stop, ") of ", out);
  const at::Tensor wc = words.contiguous(), sc = scale.contiguous();
  at::Tensor mc;
  if (minimum.has_value() && minimum->defined()) {
    mc = minimum->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kFloat && mc.sizes() == sc.sizes(), "dequantize_rows: minimum like scale");
  }
  const Matrix m{wc.data_ptr<int32_t>(), sc.data_ptr<float>(), mc.defined() ? mc.data_ptr<float>() : nullptr,
                 blocks, out, halves, offset};
  float* wp = w.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, kBlock * 4 * (stop - start)));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      switch (bits) {
        case 4: weight_columns<4>(m, b, start, stop, wp); break;
        case 5: weight_columns<5>(m, b, start, stop, wp); break;
        case 6: weight_columns<6>(m, b, start, stop, wp); break;
        default: weight_columns<8>(m, b, start, stop, wp);
      }
    }
  });
}

// Codes (out, in) int16 in [0, 2^bits) packed into int32 words (in / 32, bits, out), the layout the kernels above
// read (cpu_kernels/quantized.py `pack_codes` says it, and is the same packing in torch where this cannot run):
// 8 bits a byte each, first lowest; 4, 5, 6 bits their low nibbles in words 0-3 (code 8w + i at bits 4i of word
// w), their top bits in the words after, in `order` (`high_order`). Threads split the blocks; a load packs every
// matrix, and torch's packing was most of a 1B-class file's load.
at::Tensor pack_codes(const at::Tensor& codes, int64_t bits, at::IntArrayRef order) {
  TORCH_CHECK(codes.scalar_type() == at::kShort && codes.dim() == 2 && codes.size(1) % kBlock == 0,
              "pack_codes: int16 codes (out, in), in a multiple of 32");
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "pack_codes: 4, 5, 6 or 8 bits");
  const int64_t high = bits == 8 ? 0 : bits - 4;
  TORCH_CHECK(static_cast<int64_t>(order.size()) == (high ? kBlock : 0), "pack_codes: 32 high-order places");
  const at::Tensor cc = codes.contiguous();
  const int64_t out = cc.size(0), in = cc.size(1), blocks = in / kBlock;
  at::Tensor words = at::empty({blocks, bits, out}, cc.options().dtype(at::kInt));
  const int16_t* cp = cc.data_ptr<int16_t>();
  uint32_t* wp = reinterpret_cast<uint32_t*>(words.data_ptr<int32_t>());
  const std::vector<int64_t> place(order.begin(), order.end());
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    uint32_t packed[8];
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t o = 0; o < out; ++o) {
        const int16_t* c = cp + o * in + b * kBlock;
        std::fill(packed, packed + 8, 0u);
        if (bits == 8) {
          for (int j = 0; j < kBlock; ++j) packed[j / 4] |= static_cast<uint32_t>(c[j] & 0xFF) << (8 * (j % 4));
        } else {
          for (int j = 0; j < kBlock; ++j) packed[j / 8] |= static_cast<uint32_t>(c[j] & 15) << (4 * (j % 8));
          const int per = high ? kBlock / static_cast<int>(high) : 0;  // fields per high word
          for (int j = 0; j < (high ? kBlock : 0); ++j)
            packed[4 + j / per] |= static_cast<uint32_t>((c[place[j]] >> 4) & ((1 << high) - 1)) << (high * (j % per));
        }
        for (int64_t w = 0; w < bits; ++w) wp[(b * bits + w) * out + o] = packed[w];
      }
    }
  });
  return words;
}

// A float32 matrix w (out, in) against a few float32 rows: a dot product per output and row, four outputs at a
// time so that each load of the row serves four weight rows, each weight row read once for all rows; threads
// split the outputs. The compiled CPU step calls it for its one-row float linear layers (generation/static_decode.py,
// `OneRowLinears`): they read the weights at about the machine's bandwidth, where torch's matrix-vector product or
// Inductor's fused reduction stay below.
at::Tensor float_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2 &&
              x.dim() >= 1 && x.size(-1) == w.size(1), "float_rows: float32 rows (..., in) and weight (out, in)");
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  const int64_t in = w.size(1), out = w.size(0), n = in ? x.numel() / in : 0;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());
  const float *xp = xc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t kOuts = 4;
  const int64_t groups = (out + kOuts - 1) / kOuts;
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, in * 4 * n * kOuts));  // >= ~64 KB
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t o0 = g0 * kOuts; o0 < std::min(out, g1 * kOuts); o0 += kOuts) {
      const float* wr[kOuts];  // past the last output, the last row again: computed, not stored
      for (int64_t j = 0; j < kOuts; ++j) wr[j] = wp + std::min(o0 + j, out - 1) * in;
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = xp + r * in;
        fvec acc[kOuts] = {fset(0.f), fset(0.f), fset(0.f), fset(0.f)};
        int64_t i = 0;
        for (; i + kLanes <= in; i += kLanes) {
          const fvec xv = fload(xr + i);
          for (int64_t j = 0; j < kOuts; ++j) acc[j] = ffma(fload(wr[j] + i), xv, acc[j]);
        }
        for (int64_t j = 0; j < kOuts && o0 + j < out; ++j) {
          float sum = fsum(acc[j]);
          for (int64_t k = i; k < in; ++k) sum += wr[j][k] * xr[k];
          yp[r * out + o0 + j] = sum;
        }
      }
    }
  });
  return y;
}

// softmax(q kᵀ / sqrt(D)) v for one query per head over the visible positions of a cache, GQA: the G = H / Hkv
// query heads of a key head share each read of its cached keys and values. q (B, H, 1, D), k (B, Hkv, S, D),
// v (B, Hkv, S, Dv), visible bool (B or 1, 1, 1, S); out (B, H, 1, Dv). The compiled CPU step calls it for its
// one-query attention (generation/static_decode.py): Inductor's fused reduction over the whole buffer read the cache at
// ~8 GB/s, a sixth of a SmolLM2 Q4_1 step at 256 positions and nearly half at 1024; this reads only the visible
// positions.
inline float dot(const float* a, const float* b, int64_t n) {
  fvec acc = fset(0.f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = ffma(fload(a + i), fload(b + i), acc);
  float sum = fsum(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

at::Tensor one_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& visible) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
              visible.scalar_type() == at::kBool, "one_query_attention: float32 q, k, v and a bool mask");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1 && q.size(3) == k.size(3) &&
              k.size(0) == q.size(0) && v.sizes().slice(0, 3) == k.sizes().slice(0, 3) &&
              q.size(1) % k.size(1) == 0, "one_query_attention: q (B, H, 1, D), k and v (B, Hkv, S, D)");
  const int64_t b_n = q.size(0), h_n = q.size(1), d = q.size(3), hkv = k.size(1), s_n = k.size(2), dv = v.size(3);
  const int64_t groups = h_n / hkv;
  TORCH_CHECK(visible.numel() == s_n || visible.numel() == b_n * s_n, "one_query_attention: visible (B or 1, S)");
  // The cache's layers are views: any strides but the last (rows of D contiguous), read where they are.
  const at::Tensor qc = q.contiguous(), kc = k.stride(3) == 1 ? k : k.contiguous(),
                   vc = v.stride(3) == 1 ? v : v.contiguous(), mask = visible.contiguous();
  at::Tensor out = at::empty({b_n, h_n, 1, dv}, q.options());
  const float *qp = qc.data_ptr<float>(), *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  at::parallel_for(0, b_n * hkv, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> probs(groups * s_n), acc(dv);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / hkv, h = i % hkv;
      const float* kb = kp + b * kc.stride(0) + h * kc.stride(1);
      const float* vb = vp + b * vc.stride(0) + h * vc.stride(1);
      const bool* seen = mp + (mask.numel() == s_n ? 0 : b * s_n);
      for (int64_t g = 0; g < groups; ++g) {
        const float* qr = qp + (b * h_n + h * groups + g) * d;
        float* pr = probs.data() + g * s_n;
        float top = -std::numeric_limits<float>::infinity(), total = 0.f;
        for (int64_t s = 0; s < s_n; ++s)
          if (seen[s]) top = std::max(top, pr[s] = dot(qr, kb + s * kc.stride(2), d) * scale);
        for (int64_t s = 0; s < s_n; ++s)
          if (seen[s]) total += pr[s] = std::exp(pr[s] - top);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t s = 0; s < s_n; ++s) {
          if (!seen[s]) continue;
          const float* vr = vb + s * vc.stride(2);
          for (int64_t j = 0; j < dv; ++j) acc[j] += pr[s] * vr[j];
        }
        float* orow = op + (b * h_n + h * groups + g) * dv;
        for (int64_t j = 0; j < dv; ++j) orow[j] = acc[j] / total;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(gqa_quant, m) {
  m.def("row_product(Tensor x, Tensor words, Tensor scale, Tensor? minimum, int offset) -> Tensor");
  m.def("float_rows(Tensor x, Tensor w) -> Tensor");
  m.def("one_query_attention(Tensor q, Tensor k, Tensor v, Tensor visible) -> Tensor");
  m.def("pack_codes(Tensor codes, int bits, int[] order) -> Tensor");
  m.def("dequantize_rows(Tensor words, Tensor scale, Tensor? minimum, int offset, int start, Tensor(a!) w) -> ()");
}

TORCH_LIBRARY_IMPL(gqa_quant, CPU, m) {
  m.impl("row_product", &row_product);
  m.impl("float_rows", &float_rows);
  m.impl("one_query_attention", &one_query_attention);
  m.impl("dequantize_rows", &dequantize_rows);
  m.impl("pack_codes", &pack_codes);
}
