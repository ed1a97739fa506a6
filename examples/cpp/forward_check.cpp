// flash_cuda from C++: run the forward ops (fixed length and varlen) through the public header on
// random inputs and compare with naive attention computed by ATen in fp64. CPU inputs always (fp32,
// tolerance 1e-4); CUDA inputs (fp16 and bf16) too when a GPU is visible. The other ops (bwd,
// varlen_bwd, fwd_kvcache, combine_splits) and fwd's autograd once each on CPU. Exit status 0
// only if every case passes.
//
//   ./forward_check            (built by CMakeLists.txt, FLASH_CUDA_BUILD_EXAMPLES=ON)
#include <flash_cuda/flash_cuda.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <algorithm>
#include <tuple>
#include <vector>

namespace {

// softmax(q k^T * scale) v in fp64 with a bottom-right-aligned causal mask (query i sees key j
// iff j <= i + sk - sq; a row that sees nothing gives 0 and lse +inf). Layout (b, s, h, d), h a
// multiple of hk. Returns (out (b, sq, h, d), lse (b, h, sq)).
std::tuple<at::Tensor, at::Tensor> naive_attention(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, double scale,
                                                   bool causal) {
    const int64_t sq = q.size(1), sk = k.size(1), h = q.size(2), hk = k.size(2);
    auto qd = q.to(at::kDouble).permute({0, 2, 1, 3});  // (b, h, sq, d)
    auto kd = k.to(at::kDouble).repeat_interleave(h / hk, 2).permute({0, 2, 1, 3});
    auto vd = v.to(at::kDouble).repeat_interleave(h / hk, 2).permute({0, 2, 1, 3});
    auto scores = at::matmul(qd, kd.transpose(-2, -1)) * scale;  // (b, h, sq, sk)
    if (causal) {
        auto i = at::arange(sq, scores.options().dtype(at::kLong)).unsqueeze(1);
        auto j = at::arange(sk, scores.options().dtype(at::kLong)).unsqueeze(0);
        scores = scores.masked_fill(j > i + (sk - sq), -INFINITY);
    }
    auto lse = at::logsumexp(scores, -1);  // -inf where a row sees nothing
    auto probs = at::exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0);
    auto out = at::matmul(probs, vd).permute({0, 2, 1, 3});
    lse = lse.masked_fill(at::isinf(lse), INFINITY);
    return {out, lse};
}

bool check_case(const char* name, at::TensorOptions opts, int64_t b, int64_t sq, int64_t sk,
                int64_t h, int64_t hk, int64_t d, bool causal, double tol) {
    auto q = at::randn({b, sq, h, d}, opts);
    auto k = at::randn({b, sk, hk, d}, opts);
    auto v = at::randn({b, sk, hk, d}, opts);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));

    auto [out, lse, s_dmask, rng_state] =
        flash_cuda::fwd(q, k, v, std::nullopt, /*dropout_p=*/0.0, scale, causal);
    auto [ref_out, ref_lse] = naive_attention(q.cpu(), k.cpu(), v.cpu(), scale, causal);

    const double out_err = (out.cpu().to(at::kDouble) - ref_out).abs().max().item<double>();
    auto lse_cpu = lse.cpu().to(at::kDouble);
    const bool inf_match = at::equal(at::isinf(lse_cpu), at::isinf(ref_lse));
    auto finite = at::isfinite(ref_lse);
    const double lse_err =
        finite.any().item<bool>()
            ? (lse_cpu.masked_select(finite) - ref_lse.masked_select(finite)).abs().max()
                  .item<double>()
            : 0.0;
    // The convenience wrapper (default scale 1/sqrt(d)) must give the same output.
    const double conv_err =
        (flash_cuda::attention(q, k, v, causal).cpu().to(at::kDouble) - out.cpu().to(at::kDouble))
            .abs()
            .max()
            .item<double>();

    const bool shape_ok = out.sizes() == q.sizes() && lse.sizes() == at::IntArrayRef({b, h, sq}) &&
                          lse.scalar_type() == at::kFloat && out.scalar_type() == q.scalar_type();
    const bool ok = shape_ok && inf_match && out_err < tol && lse_err < tol && conv_err == 0.0;
    std::printf("%-4s %-28s b=%lld sq=%lld sk=%lld h=%lld hk=%lld d=%lld causal=%d: "
                "max|out-ref|=%.3g max|lse-ref|=%.3g wrapper=%.3g (tol %.0e) %s\n",
                ok ? "PASS" : "FAIL", name, (long long)b, (long long)sq, (long long)sk,
                (long long)h, (long long)hk, (long long)d, int(causal), out_err, lse_err,
                conv_err, tol, ok ? "" : (shape_ok ? (inf_match ? "" : "(lse inf mismatch)")
                                                   : "(bad shape/dtype)"));
    return ok;
}

// Varlen: sequences of different lengths packed along dim 0 must give what the fixed-length
// naive attention gives for each sequence alone.
bool check_varlen(at::TensorOptions opts, bool causal, double tol) {
    const std::vector<int64_t> lens_q = {5, 17, 1}, lens_k = {9, 17, 30};
    const int64_t h = 4, hk = 2, d = 32;
    std::vector<int32_t> cu_q = {0}, cu_k = {0};
    for (size_t i = 0; i < lens_q.size(); ++i) {
        cu_q.push_back(cu_q.back() + static_cast<int32_t>(lens_q[i]));
        cu_k.push_back(cu_k.back() + static_cast<int32_t>(lens_k[i]));
    }
    auto q = at::randn({cu_q.back(), h, d}, opts);
    auto k = at::randn({cu_k.back(), hk, d}, opts);
    auto v = at::randn({cu_k.back(), hk, d}, opts);
    auto int_opts = at::TensorOptions().dtype(at::kInt);
    auto cu_seqlens_q = at::tensor(cu_q, int_opts).to(opts.device());
    auto cu_seqlens_k = at::tensor(cu_k, int_opts).to(opts.device());
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    auto out = flash_cuda::varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, 17, 30, causal)
                   .cpu()
                   .to(at::kDouble);
    double err = 0.0;
    for (size_t i = 0; i < lens_q.size(); ++i) {
        auto qi = q.cpu().slice(0, cu_q[i], cu_q[i + 1]).unsqueeze(0);
        auto ki = k.cpu().slice(0, cu_k[i], cu_k[i + 1]).unsqueeze(0);
        auto vi = v.cpu().slice(0, cu_k[i], cu_k[i + 1]).unsqueeze(0);
        auto ref = std::get<0>(naive_attention(qi, ki, vi, scale, causal)).squeeze(0);
        err = std::max(err, (out.slice(0, cu_q[i], cu_q[i + 1]) - ref).abs().max().item<double>());
    }
    const bool ok = out.size(0) == cu_q.back() && err < tol;
    std::printf("%-4s varlen %-21s lens_q=5,17,1 lens_k=9,17,30 h=4 hk=2 d=32 causal=%d: "
                "max|out-ref|=%.3g (tol %.0e)\n",
                ok ? "PASS" : "FAIL", c10::toString(opts.dtype().toScalarType()), int(causal), err,
                tol);
    return ok;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>();
}

// The other four ops through the header, on small CPU fp64 inputs (this also checks that the
// header's C++ signatures match the registered kernels): bwd against ATen autograd of the naive
// attention; varlen_bwd with one sequence against bwd; fwd_kvcache on a full cache against fwd;
// combine_splits of a single split against its input.
bool check_other_ops() {
    const int64_t sq = 7, sk = 9, h = 2, hk = 1, d = 16;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    auto q = at::randn({1, sq, h, d}, opts);
    auto k = at::randn({1, sk, hk, d}, opts);
    auto v = at::randn({1, sk, hk, d}, opts);
    auto dout = at::randn({1, sq, h, d}, opts);
    bool ok = true;

    auto [out, lse, s_dmask, rng_state] =
        flash_cuda::fwd(q, k, v, std::nullopt, 0.0, scale, /*causal=*/true);
    auto [dq, dk, dv] = flash_cuda::bwd(dout, q, k, v, out, lse, std::nullopt, 0.0, scale,
                                        /*causal=*/true, -1, -1, 0.0, false, rng_state);
    auto qr = q.clone().requires_grad_(true);
    auto kr = k.clone().requires_grad_(true);
    auto vr = v.clone().requires_grad_(true);
    std::get<0>(naive_attention(qr, kr, vr, scale, true)).backward(dout);
    const double bwd_err = std::max({max_diff(dq, qr.grad()), max_diff(dk, kr.grad()),
                                     max_diff(dv, vr.grad())});
    ok &= bwd_err < 1e-8;

    auto cu_q = at::tensor({0, int32_t(sq)}, at::TensorOptions().dtype(at::kInt));
    auto cu_k = at::tensor({0, int32_t(sk)}, at::TensorOptions().dtype(at::kInt));
    auto [vdq, vdk, vdv] = flash_cuda::varlen_bwd(
        dout[0], q[0], k[0], v[0], out[0], lse[0], cu_q, cu_k, std::nullopt, sq, sk, 0.0, scale,
        true, -1, -1, 0.0, false, rng_state);
    const double varlen_err =
        std::max({max_diff(vdq, dq[0]), max_diff(vdk, dk[0]), max_diff(vdv, dv[0])});
    ok &= varlen_err < 1e-10;

    auto k_cache = k.clone();
    auto v_cache = v.clone();
    auto cache_seqlens = at::full({1}, sk, at::TensorOptions().dtype(at::kInt));
    auto [kv_out, kv_lse] = flash_cuda::fwd_kvcache(
        q, k_cache, v_cache, std::nullopt, std::nullopt, cache_seqlens, std::nullopt,
        std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, scale, true);
    const double kv_err = std::max(max_diff(kv_out, out), max_diff(kv_lse, lse));
    ok &= kv_err < 1e-10;

    auto out_partial = out.to(at::kFloat).permute({0, 2, 1, 3}).unsqueeze(0).contiguous();
    auto lse_partial = lse.unsqueeze(0).contiguous();
    auto [c_out, c_lse] = flash_cuda::combine_splits(out_partial, lse_partial, at::kFloat);
    const double combine_err = std::max(max_diff(c_out, out), max_diff(c_lse, lse));
    ok &= combine_err < 1e-6 && c_out.scalar_type() == at::kFloat;

    // The library's autograd (csrc/autograd.cpp): fwd on inputs that require grad records a
    // node whose backward is the bwd op, so backward() gives its gradients bitwise.
    auto [rec_out, rec_lse, rec_dmask, rec_rng] =
        flash_cuda::fwd(qr, kr, vr, std::nullopt, 0.0, scale, /*causal=*/true);
    auto grads = torch::autograd::grad({rec_out}, {qr, kr, vr}, {dout});
    const bool recorded = rec_out.requires_grad() && !rec_lse.requires_grad() &&
                          at::equal(grads[0], dq) && at::equal(grads[1], dk) &&
                          at::equal(grads[2], dv);
    ok &= recorded;

    std::printf("%-4s cpu fp64 bwd vs autograd %.3g, varlen_bwd vs bwd %.3g, fwd_kvcache vs fwd "
                "%.3g, combine_splits (1 split) %.3g, fwd's autograd = bwd: %s\n",
                ok ? "PASS" : "FAIL", bwd_err, varlen_err, kv_err, combine_err,
                recorded ? "yes" : "NO");
    return ok;
}

}  // namespace

int main() {
    try {
        at::manual_seed(0);
        bool ok = true;
        const auto cpu = at::TensorOptions().dtype(at::kFloat);
        ok &= check_case("cpu fp32", cpu, 2, 37, 53, 4, 4, 40, false, 1e-4);
        ok &= check_case("cpu fp32 causal GQA", cpu, 2, 53, 37, 4, 2, 64, true, 1e-4);
        ok &= check_varlen(cpu, false, 1e-4);
        ok &= check_varlen(cpu, true, 1e-4);
        ok &= check_other_ops();
        if (torch::cuda::is_available()) {
            for (auto dtype : {at::kHalf, at::kBFloat16}) {
                const auto gpu = at::TensorOptions().dtype(dtype).device(at::kCUDA);
                const double tol = dtype == at::kHalf ? 1e-2 : 3e-2;
                const char* name = dtype == at::kHalf ? "cuda fp16" : "cuda bf16";
                ok &= check_case(name, gpu, 2, 128, 200, 8, 2, 64, false, tol);
                ok &= check_case(name, gpu, 2, 200, 128, 8, 8, 128, true, tol);
                ok &= check_varlen(gpu, true, tol);
            }
        } else {
            std::printf("(no CUDA device: CPU cases only)\n");
        }
        std::printf("%s\n", ok ? "forward_check: OK" : "forward_check: FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::printf("forward_check: exception: %s\n", e.what());
        return 2;
    }
}
