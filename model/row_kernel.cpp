// One-row (batch-1 decode) product of a float32 row with weights kept in blocks of unsigned codes, read in the
// layout model/quantized.py packs them: int32 words (in / 32, bits, out), 4-, 5-, 6- or 8-bit codes (the
// low nibbles of 4/5/6-bit codes in words 0-3, their top bits in the words after: `pack_codes`), scale and
// minimum (in / block, out), a block 32 or 16 codes; weight = scale * (code - offset) + minimum.
//
// As llama.cpp does, the row is quantised per block of 32 and each block's codes meet it in integer
// multiply-adds (AVX2 madd: pairs of int16 products summed into int32 lanes), the block's integer sum, less
// offset times the sum of the row's codes (exact in integers), then scaled by both scales in float32. Unlike
// llama.cpp's 8 bits, the row gets 16 (scale amax / 32767): SmolLM2's rows have outliers that leave the other
// inputs of their block a few levels of 8 bits, which moved its logits by up to 2.7 and changed greedy tokens; at
// 16 bits they move by ~0.01 and the tokens are the float path's, at no measured cost in speed (madd takes int16
// pairs either way). The vectors run across 8 outputs, not along a row: the layout puts 8 outputs' words side by
// side, so one broadcast of two activations serves 8 outputs and every load is a full vector. The minimum term
// uses the exact float sum of the block's inputs. Threads split the outputs (at::parallel_for: torch's intra-op
// pool, so never more threads than torch uses), each streaming its columns block by block.
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

inline __m256i load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The integer sums of one block's codes against the row for 8 outputs, inputs 0-15 into acc[0] and 16-31 into
// acc[1]. Nibble codes: nibbles s and s + 4 of each word land in the two int16 halves of its lane (shift by 4s,
// mask 0x000F000F), their top bits shifted in from the high words, and meet their activations in one madd.
// 8 bits: even and odd bytes, zero-extended to int16. Sums stay below 2^31.
template <int kBits>
inline void block_sums(const int32_t* words, int64_t out, int64_t b, int64_t o, const int32_t* p, __m256i* acc) {
  const int32_t* wb = words + b * kBits * out + o;
  if constexpr (kBits == 8) {
    const __m256i mask = _mm256_set1_epi32(0x00FF00FF);
    for (int w = 0; w < 8; ++w) {
      const __m256i v = load(wb + w * out);
      const __m256i even = _mm256_madd_epi16(_mm256_and_si256(v, mask), _mm256_set1_epi32(p[w]));
      const __m256i odd = _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask), _mm256_set1_epi32(p[8 + w]));
      acc[w / 4] = _mm256_add_epi32(acc[w / 4], _mm256_add_epi32(even, odd));
    }
  } else {
    constexpr int kHigh = kBits - 4, kPer = kHigh ? 16 / kHigh : 1;  // top bits per code, pairs per high word
    const __m256i mask = _mm256_set1_epi32(0x000F000F), high_mask = _mm256_set1_epi32(((1 << kHigh) - 1) * 0x10001);
    __m256i high[2];
    for (int h = 0; h < kHigh; ++h) high[h] = load(wb + (4 + h) * out);
    for (int w = 0; w < 4; ++w) {
      const __m256i v = load(wb + w * out);
      for (int s = 0; s < 4; ++s) {
        __m256i codes = _mm256_and_si256(_mm256_srli_epi32(v, 4 * s), mask);
        if constexpr (kHigh > 0) {
          const int k = 4 * w + s;
          const __m256i top = _mm256_and_si256(_mm256_srli_epi32(high[k / kPer], kHigh * (k % kPer)), high_mask);
          codes = _mm256_or_si256(codes, _mm256_slli_epi32(top, 4));
        }
        acc[w / 2] = _mm256_add_epi32(acc[w / 2], _mm256_madd_epi16(codes, _mm256_set1_epi32(p[4 * w + s])));
      }
    }
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

template <int kBits>
void columns(const QuantRow& row, const Matrix& m, int64_t begin, int64_t end, float* y) {
  const int64_t vec_end = begin + (end - begin) / kLanes * kLanes, width = kBlock / m.halves;
  for (int64_t b = 0; b < m.blocks; ++b) {
    const int32_t* p = row.patterns.data() + b * kPatterns;
    for (int64_t o = begin; o < vec_end; o += kLanes) {
      __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      block_sums<kBits>(m.words, m.out, b, o, p, acc);
      if (m.halves == 1) acc[0] = _mm256_add_epi32(acc[0], acc[1]);
      __m256 yv = _mm256_loadu_ps(y + o);
      for (int64_t h = 0, r = b * m.halves; h < m.halves; ++h, ++r) {
        const __m256i ints = _mm256_sub_epi32(acc[h], _mm256_set1_epi32(static_cast<int32_t>(m.offset * row.qsum[r])));
        const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(m.scale + r * m.out + o), _mm256_set1_ps(row.step[b]));
        yv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints), scale, yv);
        if (m.minimum) yv = _mm256_fmadd_ps(_mm256_loadu_ps(m.minimum + r * m.out + o), _mm256_set1_ps(row.sum[r]), yv);
      }
      _mm256_storeu_ps(y + o, yv);
    }
    for (int64_t o = vec_end; o < end; ++o) {
      for (int64_t h = 0, r = b * m.halves; h < m.halves; ++h, ++r) {
        int32_t ints = -static_cast<int32_t>(m.offset) * row.qsum[r];
        for (int64_t j = h * width; j < (h + 1) * width; ++j)
          ints += code_at(m.words, m.out, b, o, static_cast<int>(j), kBits) * row.codes[b * kBlock + j];
        y[o] += static_cast<float>(ints) * (m.scale[r * m.out + o] * row.step[b]);
        if (m.minimum) y[o] += m.minimum[r * m.out + o] * row.sum[r];
      }
    }
  }
}

at::Tensor row_product(const at::Tensor& x, const at::Tensor& words, const at::Tensor& scale,
                       const std::optional<at::Tensor>& minimum, int64_t offset) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && words.scalar_type() == at::kInt && scale.scalar_type() == at::kFloat,
              "row_product: float32 row and scales, int32 words");
  TORCH_CHECK(words.dim() == 3, "row_product: words (in / 32, bits, out)");
  const int64_t blocks = words.size(0), bits = words.size(1), out = words.size(2);
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "row_product: 4-, 5-, 6- or 8-bit codes, got ", bits);
  TORCH_CHECK(x.numel() == blocks * kBlock, "row_product: one row of ", blocks * kBlock, " inputs");
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
  at::Tensor y = at::zeros(shape, x.options());
  const QuantRow row = quantise_row(xc.data_ptr<float>(), blocks, static_cast<int>(bits), static_cast<int>(halves));
  const Matrix m{wc.data_ptr<int32_t>(), sc.data_ptr<float>(), mc.defined() ? mc.data_ptr<float>() : nullptr,
                 blocks, out, halves, offset};
  float* yp = y.data_ptr<float>();
  // Groups of 8 outputs; a thread's share is at least ~32 KB of words, so small matrices stay on one thread.
  const int64_t groups = (out + kLanes - 1) / kLanes;
  const int64_t group_bytes = blocks * bits * 4 * kLanes;
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, group_bytes));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t begin = g0 * kLanes, end = std::min(out, g1 * kLanes);
    switch (bits) {
      case 4: return columns<4>(row, m, begin, end, yp);
      case 5: return columns<5>(row, m, begin, end, yp);
      case 6: return columns<6>(row, m, begin, end, yp);
      default: return columns<8>(row, m, begin, end, yp);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(gqa_quant, m) {
  m.def("row_product(Tensor x, Tensor words, Tensor scale, Tensor? minimum, int offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(gqa_quant, CPU, m) { m.impl("row_product", &row_product); }
