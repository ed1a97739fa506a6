// CUDA implementations of the flash_cuda ops: the only place where tensors meet kernels.
// Each op checks its arguments (checks.h), turns tensors into a params struct, and dispatches to a
// hand-written kernel on the current stream. Where no kernel covers a case yet (see
// `fwd_kernel_covers`), the op runs the exact blockwise reference (reference/reference.h) on the
// GPU instead: slower, same results, memory still linear in the sequence length.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "checks.h"
#include "flash_api.h"
#include "op_prologue.h"
#include "kernels/decode.h"
#include "kernels/launch.h"
#include "kernels/philox.cuh"
#include "kernels/sm90/bwd_sm90_host.h"
#include "kernels/sm90/fwd_sm90_host.h"
#include "reference/reference.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

namespace flash_cuda {
namespace {

// The head dims kernels are written for (FLASH_CUDA_HEADDIMS picks which are built).
constexpr std::array<int, 8> kKernelHeadDims = {32, 64, 96, 128, 160, 192, 224, 256};

// Smallest kernel head dim that holds `d` (kernels exist for these; inputs are padded to a
// multiple of 8 and the kernel predicates the columns past d).
int kernel_head_dim(int64_t d) {
    for (int hd : kKernelHeadDims) {
        if (d <= hd) return hd;
    }
    return -1;
}

bool head_dim_built(int hd) {
    switch (hd) {
#ifdef FLASH_CUDA_HAS_HDIM_32
        case 32: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_64
        case 64: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_96
        case 96: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_128
        case 128: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_160
        case 160: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_192
        case 192: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_224
        case 224: return true;
#endif
#ifdef FLASH_CUDA_HAS_HDIM_256
        case 256: return true;
#endif
        default: return false;
    }
}

// Compute capability (major, minor) of the tensor's device, asked of the runtime once per device
// (every op call checks it).
std::pair<int, int> compute_capability(const at::Tensor& t) {
    constexpr int kMaxDevices = 64;
    static std::array<std::atomic<int>, kMaxDevices> cached{};  // 10 major + minor + 1; 0: unknown
    const int device = t.get_device();
    int value = device >= 0 && device < kMaxDevices ? cached[device].load() : 0;
    if (value == 0) {
        int major = 0, minor = 0;
        C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        value = 10 * major + minor + 1;
        if (device >= 0 && device < kMaxDevices) cached[device].store(value);
    }
    return {(value - 1) / 10, (value - 1) % 10};
}

// The sm80 kernels run on compute capability 8.0 and newer.
bool device_has_sm80_kernels(const at::Tensor& t) {
    return compute_capability(t).first >= 8;
}

// The kernels move rows in 16-byte pieces: the data pointer and every stride that is used
// (dims of size > 1 other than the last) must be 16-byte aligned (8 elements of 16 bits).
bool aligned_for_kernels(const at::Tensor& t) {
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
    for (int64_t i = 0; i + 1 < t.dim(); ++i) {
        if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
    }
    return true;
}

// Pads the head dim (last dim) with zeros up to a multiple of 8 (16-byte rows for the kernels);
// copies a tensor whose pointer or strides are not 16-byte aligned.
at::Tensor pad_head_dim(const at::Tensor& t) {
    const int64_t d = t.size(-1);
    if (d % 8 == 0) return aligned_for_kernels(t) ? t : t.clone(at::MemoryFormat::Contiguous);
    return at::constant_pad_nd(t, {0, 8 - d % 8}, 0);
}

// Drops the padding columns again. The copy keeps the output contiguous, as the fake (meta)
// implementation and the CPU op promise (torch.compile checks output strides).
at::Tensor unpad_head_dim(const at::Tensor& out, int64_t head_dim) {
    if (out.size(-1) == head_dim) return out;
    return out.narrow(-1, 0, head_dim).contiguous();
}

template <typename Fn>
void dispatch_dtype(at::ScalarType dtype, Fn&& fn) {
    if (dtype == at::kBFloat16) {
        fn(__nv_bfloat16{});
    } else {
        fn(__half{});
    }
}

template <typename Element>
void run_fwd_sm80(FwdParams& params, int head_dim, cudaStream_t stream) {
    [[maybe_unused]] const bool causal = params.is_causal;
#define FLASH_CUDA_FWD_CASE(HD)                                                         \
    case HD:                                                                            \
        if (causal) {                                                                   \
            run_mha_fwd_sm80<Element, HD, /*Causal=*/true>(params, stream);             \
        } else {                                                                        \
            run_mha_fwd_sm80<Element, HD, /*Causal=*/false>(params, stream);            \
        }                                                                               \
        return;
    switch (head_dim) {
#ifdef FLASH_CUDA_HAS_HDIM_32
        FLASH_CUDA_FWD_CASE(32)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_64
        FLASH_CUDA_FWD_CASE(64)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_96
        FLASH_CUDA_FWD_CASE(96)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_128
        FLASH_CUDA_FWD_CASE(128)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_160
        FLASH_CUDA_FWD_CASE(160)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_192
        FLASH_CUDA_FWD_CASE(192)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_224
        FLASH_CUDA_FWD_CASE(224)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_256
        FLASH_CUDA_FWD_CASE(256)
#endif
        default:
            TORCH_CHECK(false, "flash_cuda: no forward kernel for head dim ", head_dim);
    }
#undef FLASH_CUDA_FWD_CASE
}

// The sm90 kernels (kernels/sm90: TMA, wgmma) run by default on sm_90 where they cover the
// call. FLASH_CUDA_SM90 in the environment switches: =0 the sm80 kernels everywhere (what an
// A100 runs), =fwd the sm90 forward only, =pingpong the sm90 forward and backward with the
// forward's pingpong variant (the consumer warpgroups take turns at the tensor cores); unset or
// =1 the default. Read per call (a getenv), so tests and benchmarks can switch inside one
// process.
enum class Sm90Mode { kOff, kForwardBackward, kPingpong, kForward };
Sm90Mode sm90_mode() {
    const char* env = std::getenv("FLASH_CUDA_SM90");
    if (env == nullptr) return Sm90Mode::kForwardBackward;
    const std::string value(env);
    if (value.empty() || value == "1") return Sm90Mode::kForwardBackward;
    if (value == "0") return Sm90Mode::kOff;
    if (value == "fwd") return Sm90Mode::kForward;
    if (value == "pingpong") return Sm90Mode::kPingpong;
    TORCH_CHECK(false, "flash_cuda: environment variable FLASH_CUDA_SM90 must be unset, 1, 0, fwd "
                "or pingpong, got '", value, "'");
}

// Compute capability 9.0 (H100 / H200): the sm_90a kernels run there only.
bool device_is_sm90(const at::Tensor& t) {
    return compute_capability(t) == std::pair<int, int>{9, 0};
}

// Programmatic dependent launch on compute capability 9.0 and newer, for split-KV decode's combine
// kernel (kernels/params.h combine_pdl) and, after a KV-cache append, its attention kernel
// (launch_pdl); FLASH_CUDA_PDL=0 in the environment (read per call) gives plain launches, for A/B
// runs. Those kernels wait in griddepcontrol.wait, which their binary has whenever it runs on
// such a device (the build embeds SASS only, and SASS compiled for compute capability 9.0 or
// newer keeps the instruction; kernels/ptx.cuh).
bool use_pdl(const at::Tensor& t) {
    const char* env = std::getenv("FLASH_CUDA_PDL");
    if (env != nullptr && std::string(env) == "0") return false;
    return compute_capability(t).first >= 9;
}

// fn(std::integral_constant<int, HD>{}) for the head dims this build has kernels for and an sm90
// kernel may cover (64, 128, 192, 256); fn returns whether it ran one. False for any other head
// dim.
template <typename Fn>
bool with_sm90_head_dim([[maybe_unused]] int head_dim, [[maybe_unused]] Fn&& fn) {
    switch (head_dim) {
#ifdef FLASH_CUDA_HAS_HDIM_64
        case 64: return fn(std::integral_constant<int, 64>{});
#endif
#ifdef FLASH_CUDA_HAS_HDIM_128
        case 128: return fn(std::integral_constant<int, 128>{});
#endif
#ifdef FLASH_CUDA_HAS_HDIM_192
        case 192: return fn(std::integral_constant<int, 192>{});
#endif
#ifdef FLASH_CUDA_HAS_HDIM_256
        case 256: return fn(std::integral_constant<int, 256>{});
#endif
        default: return false;
    }
}

// The forward of fwd / varlen_fwd: the sm90 kernel where the build has it (sm_90a, and the head
// dim's sm90 kernel: sm90::fwd_kernel_head_dim, d padded up to 64 / 128 / 192 / 256), the device
// is sm_90, it is enabled and covers the call (sm90::fwd_supports); else the sm80 kernels.
template <typename Element>
void run_fwd_kernel(FwdParams& params, [[maybe_unused]] const at::Tensor& q, cudaStream_t stream) {
#ifdef FLASH_CUDA_HAS_SM90
    const Sm90Mode mode = sm90_mode();
    if (mode != Sm90Mode::kOff && sm90::fwd_supports(params) && device_is_sm90(q)) {
        params.sm90_pingpong = mode == Sm90Mode::kPingpong;
        at::Tensor tile_counter;  // dynamic tiles: an int the kernel's CTAs count up from zero
        int num_sms = 0;
        C10_CUDA_CHECK(
            cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, q.get_device()));
        if (sm90::fwd_sm90_dynamic_tiles(params, num_sms)) {
            tile_counter = at::empty({1}, q.options().dtype(at::kInt));
            C10_CUDA_CHECK(cudaMemsetAsync(tile_counter.data_ptr(), 0, sizeof(int), stream));
            params.sm90_tile_counter = tile_counter.data_ptr<int>();
        }
        const bool ran = with_sm90_head_dim(sm90::fwd_kernel_head_dim(params.d), [&](auto hd) {
            constexpr int kHeadDim = decltype(hd)::value;
            params.is_causal ? run_mha_fwd_sm90<Element, kHeadDim, true>(params, stream)
                             : run_mha_fwd_sm90<Element, kHeadDim, false>(params, stream);
            return true;
        });
        if (ran) return;
    }
#endif
    run_fwd_sm80<Element>(params, params.d_rounded, stream);
}

// Whether a hand-written forward kernel handles this call (else: reference fallback). Dropout
// runs in the kernels (fwd_launch.cuh); return_softmax (S_dmask, a debugging output) takes the
// reference, which draws the same mask.
bool fwd_kernel_covers(const at::Tensor& q, int64_t head_dim, bool return_softmax) {
    const int hd = kernel_head_dim(head_dim);
    return hd > 0 && head_dim_built(hd) && device_has_sm80_kernels(q) && !return_softmax;
}

// The reference draws the dropout mask on the host: it cannot run inside CUDA graph capture,
// where the seed exists only on the device.
void check_reference_can_drop(const CheckedCall& call) {
    TORCH_CHECK_NOT_IMPLEMENTED(!(call.opts.dropout_p > 0.0 && call.philox.on_device()),
                                "flash_cuda: dropout inside CUDA graph capture is supported on "
                                "the kernel path only (not for this head dim / feature / "
                                "return_attn_probs=True)");
}

// Dropout fields of the params (philox.cuh's mask); p_keep = 1 leaves the kernels dropout-free.
void set_dropout_params(FwdParams& p, double dropout_p, const PhiloxSeed& philox) {
    if (!(dropout_p > 0.0)) return;
    p.p_keep = static_cast<float>(1.0 - dropout_p);
    p.p_keep_threshold = dropout_keep_threshold(p.p_keep);
    p.rp_keep = static_cast<float>(1.0 / (1.0 - dropout_p));
    p.philox_seed = philox.seed;
    p.philox_offset = philox.offset;
    p.philox_seed_ptr = philox.seed_ptr;
    p.philox_offset_ptr = philox.offset_ptr;
    p.philox_offset_intragraph = philox.offset_intragraph;
}

// The rng_state output of a kernel forward: filled here from the host values, or (seed on the
// device: graph capture) zeros that the kernel overwrites with the values it used.
at::Tensor kernel_rng_state(const at::Tensor& q, const CheckedCall& call, FwdParams& p) {
    if (!(call.opts.dropout_p > 0.0 && call.philox.on_device())) {
        return rng_state_tensor(q, call.opts);
    }
    at::Tensor rng_state = at::zeros({2}, q.options().dtype(at::kLong));
    p.rng_state = rng_state.data_ptr<int64_t>();
    return rng_state;
}

// Tuning builds (FLASH_CUDA_FWD_TUNING=1 at build time): FLASH_CUDA_FWD_TILE picks a tile
// configuration of kernels/sm80/tune_configs.h; ignored otherwise. Read once.
int fwd_tile_variant() {
    static const int variant = [] {
        const char* env = std::getenv("FLASH_CUDA_FWD_TILE");
        return env == nullptr ? 0 : std::atoi(env);
    }();
    return variant;
}

// Fields common to fixed-length and varlen forward calls. q/k/v/out already padded.
void set_fwd_params(FwdParams& p, const AttnDims& dims, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                    const reference::AttnOptions& opts) {
    const MaskArgs& mask = opts.mask;
    const OptTensor& alibi_slopes = opts.alibi_slopes;
    p = FwdParams{};
    const int seq_dim = q.dim() == 4 ? 1 : 0;  // (b, s, h, d) or (total, h, d)
    p.q_ptr = q.data_ptr();
    p.k_ptr = k.data_ptr();
    p.v_ptr = v.data_ptr();
    p.o_ptr = out.data_ptr();
    p.q_batch_stride = q.dim() == 4 ? q.stride(0) : 0;
    p.k_batch_stride = k.dim() == 4 ? k.stride(0) : 0;
    p.v_batch_stride = v.dim() == 4 ? v.stride(0) : 0;
    p.o_batch_stride = out.dim() == 4 ? out.stride(0) : 0;
    p.q_row_stride = q.stride(seq_dim);
    p.k_row_stride = k.stride(-3);
    p.v_row_stride = v.stride(-3);
    p.o_row_stride = out.stride(seq_dim);
    p.q_head_stride = q.stride(-2);
    p.k_head_stride = k.stride(-2);
    p.v_head_stride = v.stride(-2);
    p.o_head_stride = out.stride(-2);
    p.h = static_cast<int>(dims.heads);
    p.h_k = static_cast<int>(dims.heads_k);
    p.h_h_k_ratio = p.h / p.h_k;
    p.softmax_lse_ptr = lse.data_ptr<float>();
    p.b = static_cast<int>(dims.batch);
    p.seqlen_q = static_cast<int>(dims.seqlen_q);
    p.seqlen_k = static_cast<int>(dims.seqlen_k);
    p.d = static_cast<int>(q.size(-1));
    p.d_rounded = kernel_head_dim(p.d);
    p.seqlen_q_rounded = static_cast<int>((dims.seqlen_q + 127) / 128 * 128);
    p.seqlen_k_rounded = static_cast<int>((dims.seqlen_k + 127) / 128 * 128);
    p.total_q = static_cast<int>(dims.total_q);
    p.total_k = q.dim() == 3 ? static_cast<int>(k.size(0)) : 0;  // varlen (paged: unused)
    // With softcap the kernel computes softcap * tanh(s * (scale / softcap)); the scale is then
    // applied inside the tanh and the log2(e) factor after it.
    set_score_scales(p, static_cast<float>(opts.softmax_scale), static_cast<float>(opts.softcap));
    p.window_size_left = static_cast<int>(mask.window_left);
    p.window_size_right = static_cast<int>(mask.window_right);
    p.is_causal = mask.causal;
    p.is_bf16 = q.scalar_type() == at::kBFloat16;
    p.is_seqlens_k_cumulative = true;
    p.num_splits = 1;
    p.p_keep = 1.0f;
    p.rp_keep = 1.0f;
    p.p_keep_threshold = 65536u;
    p.tile_variant = fwd_tile_variant();
    if (alibi_slopes.has_value()) {
        p.alibi_slopes_ptr = alibi_slopes->data_ptr();
        p.alibi_slopes_batch_stride = alibi_slopes->dim() == 2 ? alibi_slopes->stride(0) : 0;
    }
}

// The sm80 backward kernel (verified on the H200, bench/NOTES.md run 5) is on by default;
// FLASH_CUDA_BWD_KERNEL=0 sends every backward to the reference instead. Read once.
bool bwd_kernel_enabled() {
    static const bool enabled = [] {
        const char* env = std::getenv("FLASH_CUDA_BWD_KERNEL");
        return env == nullptr || std::string(env) != "0";
    }();
    return enabled;
}

// Whether the sm80 backward kernel handles this call (fixed length or varlen); else the
// reference. Every built head dim, causal / window, softcap, ALiBi, GQA, deterministic, dropout
// (the forward's mask replayed: dropout.cuh, bwd_launch.cuh).
bool bwd_kernel_covers(const at::Tensor& q, const AttnDims& dims,
                       const reference::AttnOptions& opts) {
    const double softcap = opts.softcap, softmax_scale = opts.softmax_scale;
    if (!bwd_kernel_enabled()) return false;
    const int hd = kernel_head_dim(dims.head_dim);
    return hd > 0 && head_dim_built(hd) && device_has_sm80_kernels(q) &&
           dims.seqlen_q > 0 && dims.seqlen_k > 0 && dims.batch > 0 && dims.batch <= 65535 &&
           dims.heads <= 65535 && std::isfinite(softmax_scale) &&
           (!(softcap > 0.0) || std::isfinite(softmax_scale / softcap));
}

template <typename Element>
void run_bwd_sm80(BwdParams& params, int head_dim, cudaStream_t stream) {
    [[maybe_unused]] const bool causal = params.is_causal;
#define FLASH_CUDA_BWD_CASE(HD)                                                         \
    case HD:                                                                            \
        if (causal) {                                                                   \
            run_mha_bwd_sm80<Element, HD, /*Causal=*/true>(params, stream);             \
        } else {                                                                        \
            run_mha_bwd_sm80<Element, HD, /*Causal=*/false>(params, stream);            \
        }                                                                               \
        return;
    switch (head_dim) {
#ifdef FLASH_CUDA_HAS_HDIM_32
        FLASH_CUDA_BWD_CASE(32)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_64
        FLASH_CUDA_BWD_CASE(64)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_96
        FLASH_CUDA_BWD_CASE(96)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_128
        FLASH_CUDA_BWD_CASE(128)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_160
        FLASH_CUDA_BWD_CASE(160)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_192
        FLASH_CUDA_BWD_CASE(192)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_224
        FLASH_CUDA_BWD_CASE(224)
#endif
#ifdef FLASH_CUDA_HAS_HDIM_256
        FLASH_CUDA_BWD_CASE(256)
#endif
        default:
            TORCH_CHECK(false, "flash_cuda: no backward kernel for head dim ", head_dim);
    }
#undef FLASH_CUDA_BWD_CASE
}

// The head dim of the sm90 backward main kernel that runs the call (sm90::bwd_call_head_dim: d
// padded up to 64 / 128 / 192 / 256), or 0 for the sm80 kernels: the build has that kernel
// (sm_90a), the device is sm_90, FLASH_CUDA_SM90 is unset, 1 or pingpong (0 / "fwd" leave the
// backward on sm80) and it covers the call (sm90::bwd_supports).
int sm90_bwd_head_dim([[maybe_unused]] const BwdParams& params,
                      [[maybe_unused]] const at::Tensor& q) {
#ifdef FLASH_CUDA_HAS_SM90
    const Sm90Mode mode = sm90_mode();
    if ((mode != Sm90Mode::kForwardBackward && mode != Sm90Mode::kPingpong) ||
        !sm90::bwd_supports(params) || !device_is_sm90(q)) {
        return 0;
    }
    const int head_dim = sm90::bwd_call_head_dim(params);
    const bool built = with_sm90_head_dim(head_dim, [](auto hd) {
        return sm90::bwd_head_dim_supported(decltype(hd)::value);
    });
    return built ? head_dim : 0;
#else
    return 0;
#endif
}

// The backward main kernel (and the steps around it): sm90 where sm90_bwd_head_dim() said so (its
// head dim then in params.d_rounded).
template <typename Element>
void run_bwd_kernel(BwdParams& params, [[maybe_unused]] bool sm90, cudaStream_t stream) {
#ifdef FLASH_CUDA_HAS_SM90
    if (sm90) {
        with_sm90_head_dim(params.d_rounded, [&](auto hd) {
            constexpr int kHeadDim = decltype(hd)::value;
            if constexpr (sm90::bwd_head_dim_supported(kHeadDim)) {
                params.is_causal ? run_mha_bwd_sm90<Element, kHeadDim, true>(params, stream)
                                 : run_mha_bwd_sm90<Element, kHeadDim, false>(params, stream);
            }
            return true;
        });
        return;
    }
#endif
    run_bwd_sm80<Element>(params, params.d_rounded, stream);
}

// Deterministic backward: number of dq_accum slices (bwd.cuh). Enough CTAs to fill the GPU
// about twice, at most one per 64 keys, and at most 512 MiB of slices.
int bwd_dq_splits(const at::Tensor& q, int64_t batch_heads, int64_t seqlen_k,
                  int64_t slice_bytes) {
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.get_device()));
    int64_t splits = (2 * static_cast<int64_t>(sms) + batch_heads - 1) / batch_heads;
    splits = std::min<int64_t>(splits, (seqlen_k + 63) / 64);
    splits = std::min<int64_t>(splits, (int64_t{512} << 20) / std::max<int64_t>(slice_bytes, 1));
    return static_cast<int>(std::max<int64_t>(splits, 1));
}

// The sm80 backward kernel path of mha_bwd_cuda / mha_varlen_bwd_cuda (bwd_kernel_covers()
// holds). Varlen when cu_seqlens_q is given: q, dout, out (total_q, h, d), k, v (total_k, h_k, d),
// lse (h, total_q).
BwdResult bwd_kernel(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& softmax_lse,
                     const AttnDims& dims, const reference::AttnOptions& opts, bool deterministic,
                     const PhiloxSeed& philox, const OptTensor& cu_seqlens_q = std::nullopt,
                     const OptTensor& cu_seqlens_k = std::nullopt) {
    const bool varlen = cu_seqlens_q.has_value();
    const at::Tensor q_p = pad_head_dim(q), k_p = pad_head_dim(k), v_p = pad_head_dim(v);
    const at::Tensor out_p = pad_head_dim(out), dout_p = pad_head_dim(dout);
    const at::Tensor lse = softmax_lse.contiguous();
    const auto contiguous = at::MemoryFormat::Contiguous;
    // MHA: the main kernel writes dk / dv itself (bwd_dkv_store.cuh); varlen zeroes them first
    // (packed key rows past cu_seqlens_k[b] belong to no sequence). GQA: fp32 workspaces below.
    const bool dkv_direct = dims.heads == dims.heads_k;
    at::Tensor dq = at::empty_like(q_p, q_p.options().memory_format(contiguous));
    auto dkv_like = [&](const at::Tensor& t) {
        const auto options = t.options().memory_format(contiguous);
        return dkv_direct && varlen ? at::zeros_like(t, options) : at::empty_like(t, options);
    };
    at::Tensor dk = dkv_like(k_p);
    at::Tensor dv = dkv_like(v_p);

    BwdParams params{};
    set_fwd_params(params, dims, q_p, k_p, v_p, out_p, lse, opts);
    set_dropout_params(params, opts.dropout_p, philox);
    params.deterministic = deterministic;
    // The sm90 kernel's head dim sizes the workspaces (d zero-padded up to 64 / 128 / 192 / 256).
    const int sm90_head_dim = sm90_bwd_head_dim(params, q);
    const bool sm90 = sm90_head_dim > 0;
    if (sm90) params.d_rounded = sm90_head_dim;
    const int64_t hd = params.d_rounded;
    const auto f32 = q.options().dtype(at::kFloat);
    // Workspaces (bwd_launch.cuh): fixed length per (b, h) with rows rounded to 128, varlen
    // per head over the packed rows.
    const int64_t total_k = varlen ? k.size(0) : 0;
    const int64_t q_rows = varlen ? dims.total_q : dims.batch * params.seqlen_q_rounded;
    const int64_t dq_slice = varlen ? dims.heads * dims.total_q * hd
                                    : dims.batch * dims.heads * params.seqlen_q_rounded * hd;
    // Deterministic dq: the sm90 kernel orders its CTAs' dQ additions with one semaphore per
    // (batch, head, 64-query block) (bwd_sm90.cuh DqTurns); the sm80 one accumulates into
    // `splits` slices.
    const int splits = deterministic && !sm90
                           ? bwd_dq_splits(q, dims.batch * dims.heads, dims.seqlen_k, dq_slice * 4)
                           : 1;
    // Zeroed by the preprocess kernel (dq_accum_zero_vec4 below), not by a memset launch.
    at::Tensor dq_accum = at::empty({splits * dq_slice}, f32);
    at::Tensor dq_semaphore;
    if (deterministic && sm90) {
        dq_semaphore = at::zeros({dims.batch * dims.heads * (params.seqlen_q_rounded / 64)},
                                 q.options().dtype(at::kInt));
        params.dq_semaphore = dq_semaphore.data_ptr<int>();
    }
    at::Tensor dk_accum, dv_accum;  // GQA only
    if (!dkv_direct && varlen) {  // zeroed: packed rows past cu_seqlens_k[b] belong to no sequence
        dk_accum = at::zeros({dims.heads, total_k, hd}, f32);
        dv_accum = at::zeros({dims.heads, total_k, hd}, f32);
    } else if (!dkv_direct) {
        dk_accum = at::empty({dims.batch, dims.heads, params.seqlen_k_rounded, hd}, f32);
        dv_accum = at::empty({dims.batch, dims.heads, params.seqlen_k_rounded, hd}, f32);
    }
    at::Tensor dsum = at::empty({dims.heads * q_rows}, f32);
    const int64_t seq_dim = varlen ? 0 : 1;
    params.do_ptr = dout_p.data_ptr();
    params.do_batch_stride = varlen ? 0 : dout_p.stride(0);
    params.do_row_stride = dout_p.stride(seq_dim);
    params.do_head_stride = dout_p.stride(-2);
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk.data_ptr();
    params.dv_ptr = dv.data_ptr();
    params.dq_batch_stride = varlen ? 0 : dq.stride(0);
    params.dk_batch_stride = varlen ? 0 : dk.stride(0);
    params.dv_batch_stride = varlen ? 0 : dv.stride(0);
    params.dq_row_stride = dq.stride(seq_dim);
    params.dk_row_stride = dk.stride(seq_dim);
    params.dv_row_stride = dv.stride(seq_dim);
    params.dq_head_stride = dq.stride(-2);
    params.dk_head_stride = dk.stride(-2);
    params.dv_head_stride = dv.stride(-2);
    params.dq_accum_ptr = dq_accum.data_ptr();
    params.dq_accum_zero_vec4 = dq_accum.numel() / 4;  // hd: a multiple of 8
    params.dk_accum_ptr = dkv_direct ? nullptr : dk_accum.data_ptr();
    params.dv_accum_ptr = dkv_direct ? nullptr : dv_accum.data_ptr();
    params.dkv_direct = dkv_direct;
    params.dsoftmax_sum = dsum.data_ptr();
    params.num_splits = splits;
    params.dq_accum_split_stride = splits > 1 ? dq_slice : 0;
    if (varlen) {
        params.cu_seqlens_q = cu_seqlens_q->data_ptr<int>();
        params.cu_seqlens_k = cu_seqlens_k->data_ptr<int>();
        params.unpadded_lse = true;
    }
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    dispatch_dtype(q.scalar_type(), [&](auto element) {
        run_bwd_kernel<decltype(element)>(params, sm90, stream);
    });
    return {unpad_head_dim(dq, dims.head_dim), unpad_head_dim(dk, dims.head_dim),
            unpad_head_dim(dv, dims.head_dim)};
}

}  // namespace

FwdResult mha_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                       const OptTensor& alibi_slopes, double dropout_p, double softmax_scale,
                       bool causal, int64_t window_size_left, int64_t window_size_right,
                       double softcap, bool return_softmax, const OptTensor& rng_state,
                       bool /*deterministic: used by the backward*/) {
    const CheckedCall call = fwd_prologue(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal,
                                          window_size_left, window_size_right, softcap, rng_state);
    const AttnDims& dims = call.dims;
    c10::cuda::CUDAGuard guard(q.device());
    if (!fwd_kernel_covers(q, dims.head_dim, return_softmax)) {
        check_reference_can_drop(call);
        auto [out, lse, s_dmask] = reference::fwd(q, k, v, call.opts, return_softmax);
        return {out, lse, s_dmask, rng_state_tensor(q, call.opts)};
    }

    const at::Tensor q_p = pad_head_dim(q), k_p = pad_head_dim(k), v_p = pad_head_dim(v);
    at::Tensor out = at::empty_like(q_p, q_p.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor lse = at::empty({dims.batch, dims.heads, dims.seqlen_q}, q.options().dtype(at::kFloat));
    FwdParams params;
    set_fwd_params(params, dims, q_p, k_p, v_p, out, lse, call.opts);
    set_dropout_params(params, dropout_p, call.philox);
    at::Tensor rng_state_out = kernel_rng_state(q, call, params);
    if (dims.seqlen_q > 0) {
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
        dispatch_dtype(q.scalar_type(), [&](auto element) {
            run_fwd_kernel<decltype(element)>(params, q, stream);
        });
    }
    out = unpad_head_dim(out, dims.head_dim);
    return {out, lse, at::empty({0}, q.options()), rng_state_out};
}

FwdResult mha_varlen_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                              const OptTensor& seqused_k, const OptTensor& block_table,
                              const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                              bool causal, int64_t window_size_left, int64_t window_size_right,
                              double softcap, bool return_softmax, const OptTensor& rng_state,
                              bool /*deterministic: used by the backward*/) {
    const CheckedCall call = varlen_fwd_prologue(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, rng_state);
    const AttnDims& dims = call.dims;
    c10::cuda::CUDAGuard guard(q.device());
    const bool kernel = fwd_kernel_covers(q, dims.head_dim, return_softmax);
    if (!kernel) {
        check_reference_can_drop(call);
        auto [out, lse, s_dmask] =
            reference::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                  max_seqlen_q, max_seqlen_k, call.opts, return_softmax);
        return {out, lse, s_dmask, rng_state_tensor(q, call.opts)};
    }

    const at::Tensor q_p = pad_head_dim(q), k_p = pad_head_dim(k), v_p = pad_head_dim(v);
    at::Tensor out = at::empty_like(q_p, q_p.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor lse = at::empty({dims.heads, dims.total_q}, q.options().dtype(at::kFloat));
    FwdParams params;
    set_fwd_params(params, dims, q_p, k_p, v_p, out, lse, call.opts);
    params.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
    params.cu_seqlens_k = cu_seqlens_k.data_ptr<int>();
    params.seqused_k = seqused_k.has_value() ? seqused_k->data_ptr<int>() : nullptr;
    params.unpadded_lse = true;
    if (block_table.has_value()) {
        // Paged KV: k/v (num_blocks, page, h_k, d); k/v batch strides are the block strides.
        params.block_table = block_table->data_ptr<int>();
        params.block_table_batch_stride = block_table->stride(0);
        params.page_block_size = static_cast<int>(k.size(1));
        params.block_table_cols = static_cast<int>(block_table->size(1));
        params.num_pages = static_cast<int>(k.size(0));
    }
    set_dropout_params(params, dropout_p, call.philox);
    at::Tensor rng_state_out = kernel_rng_state(q, call, params);
    if (dims.total_q > 0 && max_seqlen_q > 0) {
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
        dispatch_dtype(q.scalar_type(), [&](auto element) {
            run_fwd_kernel<decltype(element)>(params, q, stream);
        });
    }
    out = unpad_head_dim(out, dims.head_dim);
    return {out, lse, at::empty({0}, q.options()), rng_state_out};
}

BwdResult mha_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& softmax_lse,
                       const OptTensor& alibi_slopes, double dropout_p, double softmax_scale,
                       bool causal, int64_t window_size_left, int64_t window_size_right,
                       double softcap, bool deterministic, const Tensor& rng_state) {
    const CheckedCall call =
        bwd_prologue(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, softmax_scale,
                     causal, window_size_left, window_size_right, softcap, rng_state);
    c10::cuda::CUDAGuard guard(q.device());
    // The sm80 kernel where it covers the call (FLASH_CUDA_BWD_KERNEL=0 turns it off); else the
    // exact reference, deterministic.
    if (bwd_kernel_covers(q, call.dims, call.opts)) {
        return bwd_kernel(dout, q, k, v, out, softmax_lse, call.dims, call.opts, deterministic,
                          call.philox);
    }
    check_reference_can_drop(call);
    return reference::bwd(dout, q, k, v, out, softmax_lse, call.opts);
}

BwdResult mha_varlen_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                              const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                              bool causal, int64_t window_size_left, int64_t window_size_right,
                              double softcap, bool deterministic, const Tensor& rng_state) {
    const CheckedCall call = varlen_bwd_prologue(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, rng_state);
    c10::cuda::CUDAGuard guard(q.device());
    // The sm80 kernel where it covers the call (packed rows, per-sequence lengths); else the
    // exact reference, deterministic.
    if (call.dims.total_q > 0 && k.size(0) > 0 && k.size(0) <= INT32_MAX &&
        bwd_kernel_covers(q, call.dims, call.opts)) {
        return bwd_kernel(dout, q, k, v, out, softmax_lse, call.dims, call.opts, deterministic,
                          call.philox, cu_seqlens_q, cu_seqlens_k);
    }
    check_reference_can_drop(call);
    return reference::varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, call.opts);
}

namespace {

// What the attention of fwd_kvcache reads once the append step has run.
struct KvcacheAppended {
    at::Tensor q;       // q, or q rotated (a new contiguous tensor) when rotary is on
    OptTensor seqlens;  // int32 (b): keys per sequence, cache_seqlens + new tokens (or none)
    bool launched = false;  // the append kernel ran: the attention may be PDL-launched after it
};

// The append step of fwd_kvcache, one launch of kernels/kvcache_append.cuh on the current
// stream, no host sync (capturable): the new k (rotary applied) and v are written into the
// cache at cache_seqlens (contiguous rows cache_batch_idx, or the pages of block_table), and q
// is rotated at its positions (every query at cache_seqlens, or at cache_seqlens + row with a
// causal/local mask, as the reference). Arguments already checked (kvcache_prologue).
KvcacheAppended kvcache_append_step(const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
                                    const OptTensor& k, const OptTensor& v,
                                    const OptTensor& cache_seqlens, const OptTensor& rotary_cos,
                                    const OptTensor& rotary_sin, const OptTensor& cache_batch_idx,
                                    const OptTensor& block_table, bool rotary_interleaved,
                                    const MaskArgs& mask) {
    const int64_t seqlen_new = k.has_value() ? k->size(1) : 0;
    const bool rotary = rotary_cos.has_value();
    KvcacheAppended result{q, cache_seqlens};
    if (seqlen_new == 0 && !rotary) return result;
    KvAppendParams p{};
    p.b = static_cast<int>(q.size(0));
    p.seqlen_new = static_cast<int>(seqlen_new);
    p.h_k = static_cast<int>(k_cache.size(2));
    p.d = static_cast<int>(q.size(3));
    if (seqlen_new > 0) {
        p.knew_ptr = k->data_ptr();
        p.vnew_ptr = v->data_ptr();
        p.knew_batch_stride = k->stride(0);
        p.knew_row_stride = k->stride(1);
        p.knew_head_stride = k->stride(2);
        p.vnew_batch_stride = v->stride(0);
        p.vnew_row_stride = v->stride(1);
        p.vnew_head_stride = v->stride(2);
    }
    p.kcache_ptr = k_cache.data_ptr();
    p.vcache_ptr = v_cache.data_ptr();
    p.kcache_batch_stride = k_cache.stride(0);
    p.kcache_row_stride = k_cache.stride(1);
    p.kcache_head_stride = k_cache.stride(2);
    p.vcache_batch_stride = v_cache.stride(0);
    p.vcache_row_stride = v_cache.stride(1);
    p.vcache_head_stride = v_cache.stride(2);
    p.cache_batch = static_cast<int>(k_cache.size(0));
    p.capacity = block_table.has_value() ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
    p.cache_seqlens = cache_seqlens.has_value() ? cache_seqlens->data_ptr<int>() : nullptr;
    p.cache_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
    if (block_table.has_value()) {
        p.block_table = block_table->data_ptr<int>();
        p.block_table_batch_stride = block_table->stride(0);
        p.max_blocks = static_cast<int>(block_table->size(1));
        p.page_size = static_cast<int>(k_cache.size(1));
    }
    if (rotary) {
        result.q = at::empty_like(q, q.options().memory_format(at::MemoryFormat::Contiguous));
        p.rotary_dim = static_cast<int>(2 * rotary_cos->size(1));
        p.seqlen_ro = static_cast<int>(rotary_cos->size(0));
        p.rotary_interleaved = rotary_interleaved;
        p.q_positions_per_row = mask.causal || mask.window_left >= 0 || mask.window_right >= 0;
        p.rotary_cos_ptr = rotary_cos->data_ptr();
        p.rotary_sin_ptr = rotary_sin->data_ptr();
        p.q_ptr = q.data_ptr();
        p.qrot_ptr = result.q.data_ptr();
        p.q_batch_stride = q.stride(0);
        p.q_row_stride = q.stride(1);
        p.q_head_stride = q.stride(2);
        p.qrot_batch_stride = result.q.stride(0);
        p.qrot_row_stride = result.q.stride(1);
        p.qrot_head_stride = result.q.stride(2);
        p.seqlen_q = static_cast<int>(q.size(1));
        p.h = static_cast<int>(q.size(2));
    }
    if (seqlen_new > 0) {  // cache_seqlens + new tokens, written by the append kernel
        result.seqlens = at::empty({p.b}, cache_seqlens->options().dtype(at::kInt));
        p.seqlens_out = result.seqlens->data_ptr<int>();
    }
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    dispatch_dtype(q.scalar_type(), [&](auto element) {
        result.launched = run_kvcache_append<decltype(element)>(p, stream);
    });
    return result;
}

}  // namespace

std::tuple<Tensor, Tensor> mha_fwd_kvcache_cuda(
    const Tensor& q, Tensor& k_cache, Tensor& v_cache, const OptTensor& k, const OptTensor& v,
    const OptTensor& cache_seqlens, const OptTensor& rotary_cos, const OptTensor& rotary_sin,
    const OptTensor& cache_batch_idx, const OptTensor& cache_leftpad,
    const OptTensor& block_table, const OptTensor& alibi_slopes, double softmax_scale,
    bool causal, int64_t window_size_left, int64_t window_size_right, double softcap,
    bool rotary_interleaved, int64_t num_splits) {
    const CheckedCall call = kvcache_prologue(
        q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_size_left,
        window_size_right, softcap, num_splits);
    const AttnDims& dims = call.dims;
    c10::cuda::CUDAGuard guard(q.device());
    if (!device_has_sm80_kernels(q)) {  // no kernel of this build runs here: all reference
        return reference::kvcache(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos,
                                  rotary_sin, cache_batch_idx, cache_leftpad, block_table,
                                  rotary_interleaved, call.opts);
    }
    // 1. Append step: new k (rotary applied) and v into the cache, q rotated (one kernel).
    const KvcacheAppended appended =
        kvcache_append_step(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin,
                            cache_batch_idx, block_table, rotary_interleaved, call.opts.mask);
    const at::Tensor& q_attn = appended.q;
    const OptTensor& seqlens = appended.seqlens;

    // 2. Attention over the updated cache with q_attn: the forward kernel reads the cache in
    // place (contiguous rows, cache_batch_idx, cache_leftpad, or pages through block_table),
    // each sequence limited to its cache_seqlens + new tokens (seqused_k), split over the keys
    // when that fills the GPU better. Head dims that need padding take the exact reference,
    // given what the append step produced (nothing is appended or rotated twice).
    const bool kernel = fwd_kernel_covers(q, dims.head_dim, false) &&
                        dims.head_dim % 8 == 0 && aligned_for_kernels(q_attn) &&
                        aligned_for_kernels(k_cache) && aligned_for_kernels(v_cache);
    if (!kernel) {
        return reference::kvcache(q_attn, k_cache, v_cache, std::nullopt, std::nullopt, seqlens,
                                  std::nullopt, std::nullopt, cache_batch_idx, cache_leftpad,
                                  block_table, rotary_interleaved, call.opts);
    }
    at::Tensor out = at::empty_like(q, q.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor lse = at::empty({dims.batch, dims.heads, dims.seqlen_q}, q.options().dtype(at::kFloat));
    if (dims.seqlen_q == 0) return {out, lse};
    FwdParams params;
    set_fwd_params(params, dims, q_attn, k_cache, v_cache, out, lse, call.opts);
    params.seqused_k = seqlens.has_value() ? seqlens->data_ptr<int>() : nullptr;
    params.cache_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
    params.kv_cache_rows = static_cast<int>(k_cache.size(0));
    params.leftpad_k = cache_leftpad.has_value() ? cache_leftpad->data_ptr<int>() : nullptr;
    if (block_table.has_value()) {
        params.block_table = block_table->data_ptr<int>();
        params.block_table_batch_stride = block_table->stride(0);
        params.page_block_size = static_cast<int>(k_cache.size(1));
        params.block_table_cols = static_cast<int>(block_table->size(1));
        params.num_pages = static_cast<int>(k_cache.size(0));
    }
    params.launch_pdl = appended.launched && use_pdl(q);  // split-KV tiles only (fwd_launch)
    int num_sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, q.get_device()));
    const bool ring_device = device_is_sm90(q) && sm90_mode() != Sm90Mode::kOff;
    // Packing (decode.h): one-token steps on contiguous caches may put several KV heads in one
    // tile (head groups); else the query heads of a KV head become the rows of one tile, by
    // re-striding q/o (one query row, no left window) or in the kernel (up to 64 query rows).
    // Not with ALiBi.
    decode::plan_packing(params, num_sms, ring_device);
    // d128 key-split calls: 128-key blocks where they pay; on sm_90 (unless FLASH_CUDA_SM90=0,
    // what an A100 runs) the warp-specialised ring tiles where decode.h's rule takes them.
    decode::plan_decode_tile(params, num_sms, ring_device);
    params.num_splits = decode::num_splits(static_cast<int>(num_splits), decode::num_tiles(params),
                                           decode::key_columns(params),
                                           decode::uses_decode_tile(params),
                                           decode::split_geometry(params), num_sms);
    decode::plan_kv_overlap(params, num_sms, ring_device);  // paged 128-key: V copies with K's
    // Split-KV workspaces: sizes from shapes only (CUDA-graph capturable).
    at::Tensor out_accum, lse_accum;
    if (params.num_splits > 1) {
        const auto f32 = q.options().dtype(at::kFloat);
        out_accum = at::empty({params.num_splits, params.b, params.h, params.seqlen_q,
                               params.d_rounded}, f32);
        lse_accum = at::empty({params.num_splits, params.b, params.h, params.seqlen_q}, f32);
        params.oaccum_ptr = out_accum.data_ptr();
        params.softmax_lseaccum_ptr = lse_accum.data_ptr<float>();
        params.combine_pdl = use_pdl(q);
    }
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    dispatch_dtype(q.scalar_type(), [&](auto element) {
        run_fwd_sm80<decltype(element)>(params, params.d_rounded, stream);
        if (params.num_splits > 1) run_combine_splits<decltype(element)>(params, stream);
    });
    return {out, lse};
}

std::tuple<Tensor, Tensor> combine_splits_cuda(const Tensor& out_partial,
                                               const Tensor& lse_partial,
                                               at::ScalarType out_dtype) {
    check_combine_inputs(out_partial, lse_partial, out_dtype);
    c10::cuda::CUDAGuard guard(out_partial.device());
    const at::Tensor o_acc = out_partial.contiguous();
    const at::Tensor lse_acc = lse_partial.contiguous();
    const int64_t splits = o_acc.size(0), b = o_acc.size(1), h = o_acc.size(2),
                  sq = o_acc.size(3), d = o_acc.size(4);
    at::Tensor out = at::empty({b, sq, h, d}, o_acc.options().dtype(out_dtype));
    at::Tensor lse = at::empty({b, h, sq}, o_acc.options());
    if (out.numel() == 0 && lse.numel() == 0) return {out, lse};
    FwdParams p{};
    p.oaccum_ptr = o_acc.data_ptr();
    p.softmax_lseaccum_ptr = lse_acc.data_ptr<float>();
    p.o_ptr = out.data_ptr();
    p.softmax_lse_ptr = lse.data_ptr<float>();
    p.o_batch_stride = out.stride(0);
    p.o_row_stride = out.stride(1);
    p.o_head_stride = out.stride(2);
    p.b = static_cast<int>(b);
    p.h = static_cast<int>(h);
    p.seqlen_q = static_cast<int>(sq);
    p.d = static_cast<int>(d);
    p.d_rounded = static_cast<int>(d);
    p.num_splits = static_cast<int>(splits);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    dispatch_dtype(out_dtype, [&](auto element) {
        run_combine_splits<decltype(element)>(p, stream);
    });
    return {out, lse};
}

std::string built_head_dims() {
    std::string dims;
    for (int hd : kKernelHeadDims) {
        if (!head_dim_built(hd)) continue;
        if (!dims.empty()) dims += ',';
        dims += std::to_string(hd);
    }
    return dims;
}

}  // namespace flash_cuda
