// One-row (batch-1 decode) product of a float32 row with weights kept in blocks of 32 codes, read in the
// layout model/quantized.py packs them: int32 words (in / 32, bits, out), word w of a block holding inputs
// w*k .. w*k+k-1 (k = 32 / bits) of every output, the first in the lowest bits; scale and minimum (in / 32, out).
//
// As llama.cpp does, the row is quantised per block of 32 and each block's codes meet it in integer
// multiply-adds (AVX2 madd: pairs of int16 products summed into int32 lanes), the block's integer sum then
// scaled by both scales in float32. Unlike llama.cpp's 8 bits, the row gets 16 (scale amax / 32767): SmolLM2's
// rows have outliers that leave the other inputs of their block a few levels of 8 bits, which moved its
// logits by up to 2.7 and changed greedy tokens; at 16 bits they move by ~0.01 and the tokens are the float
// path's, at no measured cost in speed (madd takes int16 pairs either way). The vectors run across 8 outputs,
// not along a row: the layout puts 8 outputs' words side by side, so one broadcast of two activations serves 8
// outputs and every load is a full vector. The minimum term uses the exact float sum of the block's inputs.
// Threads split the outputs (at::parallel_for: torch's intra-op pool, so never more threads than torch uses),
// each streaming its columns block by block.
//
// Compiled for AVX2 + FMA only (flags given by model/quantized.py, which checks the CPU at run time first).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kLanes = 8;  // outputs per vector
constexpr float kLimit = 32767.f;  // activations' codes: 16 bits
constexpr int64_t kPatterns = 16;  // broadcast int32 patterns per block

// The row quantised per block to 16 bits, as int16 pairs in the orders the kernels broadcast: for 4-bit codes
// pattern (b, 4w + s) holds inputs 8w+s and 8w+s+4 (nibbles s and s+4 of word w), for 8-bit codes (b, w)
// holds inputs 4w and 4w+2 (bytes 0 and 2) and (b, 8 + w) inputs 4w+1 and 4w+3.
struct QuantRow {
  std::vector<int32_t> codes;  // the quantised row itself, for the outputs past the last multiple of 8
  std::vector<int32_t> patterns;
  std::vector<float> step;  // amax / 32767 of each block
  std::vector<float> sum;   // exact float sum of each block's inputs, for the minimum
};

QuantRow quantise_row(const float* x, int64_t blocks, int bits) {
  QuantRow row;
  row.codes.resize(blocks * kBlock);
  row.patterns.resize(blocks * kPatterns);
  row.step.resize(blocks);
  row.sum.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    int32_t* q = row.codes.data() + b * kBlock;
    float amax = 0.f, sum = 0.f;
    for (int j = 0; j < kBlock; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      sum += xb[j];
    }
    // A NaN or infinite input makes its block's step NaN (codes 0), so every output is NaN, as in float.
    const float step = std::isfinite(sum) ? amax / kLimit : std::numeric_limits<float>::quiet_NaN();
    const float inv = step > 0.f ? 1.f / step : 0.f;
    for (int j = 0; j < kBlock; ++j) q[j] = static_cast<int32_t>(std::nearbyint(xb[j] * inv));
    row.step[b] = step;
    row.sum[b] = sum;
    int32_t* p = row.patterns.data() + b * kPatterns;
    auto pair16 = [](int32_t a, int32_t c) {
      return static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(c)) << 16) |
                                  static_cast<uint16_t>(a));
    };
    for (int w = 0; w < bits; ++w) {
      if (bits == 8) {
        p[w] = pair16(q[4 * w], q[4 * w + 2]);
        p[8 + w] = pair16(q[4 * w + 1], q[4 * w + 3]);
      } else {
        for (int sh = 0; sh < 4; ++sh) p[4 * w + sh] = pair16(q[8 * w + sh], q[8 * w + sh + 4]);
      }
    }
  }
  return row;
}

// 4 bits: nibbles s and s + 4 of each word land in the two int16 halves of its lane
// (shift by 4s, mask 0x000F000F) and meet their activations in one madd; sums stay below 2^31.
inline __m256i block_sum4(const int32_t* words, int64_t out, int64_t b, int64_t o, const int32_t* p) {
  const __m256i mask = _mm256_set1_epi32(0x000F000F);
  __m256i acc = _mm256_setzero_si256();
  for (int w = 0; w < 4; ++w) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + (b * 4 + w) * out + o));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_and_si256(v, mask), _mm256_set1_epi32(p[4 * w])));
    acc = _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(v, 4), mask), _mm256_set1_epi32(p[4 * w + 1])));
    acc = _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask), _mm256_set1_epi32(p[4 * w + 2])));
    acc = _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(v, 12), mask), _mm256_set1_epi32(p[4 * w + 3])));
  }
  return acc;
}

// 8 bits: signed codes, sign-extended to int16 (even and odd bytes) and paired with int16 activations by
// madd, exact for every code, -128 included.
inline __m256i block_sum8(const int32_t* words, int64_t out, int64_t b, int64_t o, const int32_t* p) {
  __m256i acc = _mm256_setzero_si256();
  for (int w = 0; w < 8; ++w) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + (b * 8 + w) * out + o));
    const __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
    const __m256i odd = _mm256_srai_epi16(v, 8);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(even, _mm256_set1_epi32(p[w])));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(odd, _mm256_set1_epi32(p[8 + w])));
  }
  return acc;
}

// The same sums one output at a time, for the outputs past the last multiple of 8.
int32_t scalar_sum(const int32_t* words, int64_t out, int64_t b, int64_t o, const int32_t* q, int bits) {
  const int per_word = 32 / bits;
  int32_t acc = 0;
  for (int w = 0; w < bits; ++w) {
    const uint32_t v = static_cast<uint32_t>(words[(b * bits + w) * out + o]);
    for (int i = 0; i < per_word; ++i) {
      const uint32_t field = (v >> (bits * i)) & ((1u << bits) - 1);
      const int32_t code = bits == 4 ? static_cast<int32_t>(field) : static_cast<int8_t>(field);
      acc += code * q[w * per_word + i];
    }
  }
  return acc;
}

void columns(const QuantRow& row, const int32_t* words, const float* scale, const float* minimum, int64_t blocks,
             int64_t out, int bits, int64_t begin, int64_t end, float* y) {
  const int64_t vec_end = begin + (end - begin) / kLanes * kLanes;
  for (int64_t b = 0; b < blocks; ++b) {
    const int32_t* p = row.patterns.data() + b * kPatterns;
    const __m256 step = _mm256_set1_ps(row.step[b]);
    const __m256 sum = _mm256_set1_ps(row.sum[b]);
    const float* sb = scale + b * out;
    const float* mb = minimum ? minimum + b * out : nullptr;
    for (int64_t o = begin; o < vec_end; o += kLanes) {
      const __m256i ints = bits == 8 ? block_sum8(words, out, b, o, p) : block_sum4(words, out, b, o, p);
      __m256 acc = _mm256_loadu_ps(y + o);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints), _mm256_mul_ps(_mm256_loadu_ps(sb + o), step), acc);
      if (mb) acc = _mm256_fmadd_ps(_mm256_loadu_ps(mb + o), sum, acc);
      _mm256_storeu_ps(y + o, acc);
    }
    for (int64_t o = vec_end; o < end; ++o) {
      const int32_t ints = scalar_sum(words, out, b, o, row.codes.data() + b * kBlock, bits);
      y[o] += static_cast<float>(ints) * (sb[o] * row.step[b]);
      if (mb) y[o] += mb[o] * row.sum[b];
    }
  }
}

at::Tensor row_product(const at::Tensor& x, const at::Tensor& words, const at::Tensor& scale,
                       const std::optional<at::Tensor>& minimum, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "row_product: 4- or 8-bit codes, got ", bits);
  TORCH_CHECK(x.scalar_type() == at::kFloat && words.scalar_type() == at::kInt && scale.scalar_type() == at::kFloat,
              "row_product: float32 row and scales, int32 words");
  TORCH_CHECK(words.dim() == 3 && words.size(1) == bits, "row_product: words (in / 32, bits, out)");
  const int64_t blocks = words.size(0), out = words.size(2);
  TORCH_CHECK(x.numel() == blocks * kBlock, "row_product: one row of ", blocks * kBlock, " inputs");
  TORCH_CHECK(scale.sizes() == at::IntArrayRef({blocks, out}), "row_product: scale (in / 32, out)");
  const at::Tensor xc = x.contiguous(), wc = words.contiguous(), sc = scale.contiguous();
  at::Tensor mc;
  if (minimum.has_value() && minimum->defined()) {
    mc = minimum->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kFloat && mc.sizes() == sc.sizes(), "row_product: minimum like scale");
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::zeros(shape, x.options());
  const float* xp = xc.data_ptr<float>();
  const QuantRow row = quantise_row(xp, blocks, static_cast<int>(bits));
  const int32_t* wp = wc.data_ptr<int32_t>();
  const float* sp = sc.data_ptr<float>();
  const float* mp = mc.defined() ? mc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Groups of 8 outputs; a thread's share is at least ~32 KB of words, so small matrices stay on one thread.
  const int64_t groups = (out + kLanes - 1) / kLanes;
  const int64_t group_bytes = blocks * bits * 4 * kLanes;
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, group_bytes));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    columns(row, wp, sp, mp, blocks, out, static_cast<int>(bits), g0 * kLanes, std::min(out, g1 * kLanes), yp);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(gqa_quant, m) {
  m.def("row_product(Tensor x, Tensor words, Tensor scale, Tensor? minimum, int bits) -> Tensor");
}

TORCH_LIBRARY_IMPL(gqa_quant, CPU, m) { m.impl("row_product", &row_product); }
