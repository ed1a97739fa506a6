// Runs the sm80 backward kernels (csrc/kernels/sm80/bwd.cuh) on the CPU emulator (prelude.h).
//
//   bwd_emulated CASE_DIR
// CASE_DIR/params.txt: "key value" lines; q.bin, k.bin, v.bin, o.bin, do.bin: raw 16-bit
// storage (offsets / strides in params.txt); lse.bin: fp32 (b, h, sq) contiguous, or
// (h, total_q) varlen; optional alibi.bin (fp32), cu_seqlens_q.bin / cu_seqlens_k.bin (int32,
// varlen: then q, o, do are (total_q, h, d), k, v (total_k, hk, d)). params.txt also has
// softcap, deterministic, splits (deterministic dq slices), total_q, total_k.
// Writes dq.bin (b, sq, h, d), dk.bin, dv.bin (b, sk, hk, d), contiguous, d = padded head dim
// (varlen: (total_q, h, d), (total_k, hk, d)).
// Output buffers and workspaces have guard zones, checked after the run.
// Build with -DEMU_HEAD_DIM=<kernel head dim>.
#include <atomic>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>

thread_local dim3 blockDim;
// fp32 atomicAdd of the device (the emulator runs a block's threads concurrently).
inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}

#include "kernels/sm80/bwd.cuh"
#include "kernels/sm80/bwd_v2.cuh"
#include "kernels/sm80/bwd_tune_configs.h"
#include "kernels/sm90/bwd_sm90_host.h"
#if EMU_HEAD_DIM == 64 || EMU_HEAD_DIM == 128 || EMU_HEAD_DIM == 192 || EMU_HEAD_DIM == 256
#include "kernels/sm90/bwd_sm90_wide.cuh"
#endif
#include "host_io.h"
#include "dropout_params.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 gridDim;

namespace {

using flash_cuda::BwdParams;
using namespace emu_host;


template <typename Kernel>
void launch(dim3 grid, int threads, size_t smem, Kernel kernel, BwdParams& params) {
    emu::launch(grid, threads, smem, [&] {
        blockDim = dim3(threads, 1, 1);
        kernel(params);
    });
}

// The v2 tile of the head dim (dependent on Element, so head dims without v2 never name it).
template <typename Element, int HeadDim>
struct EmuV2 {
#if defined(FLASH_CUDA_EMU_BWD_TILE) && FLASH_CUDA_EMU_BWD_TILE > 0
    static_assert(flash_cuda::sm80::BwdV2TuneConfig<HeadDim, FLASH_CUDA_EMU_BWD_TILE>::kExists,
                  "no such tile variant at this head dim");
    using Traits =
        typename flash_cuda::sm80::BwdV2TuneConfig<HeadDim, FLASH_CUDA_EMU_BWD_TILE>::Traits;
#else
    using Traits = typename flash_cuda::sm80::BwdV2Config<HeadDim>::Traits;
#endif
};

// HeadDim = EMU_HEAD_DIM, a template parameter so that the kernel choice below is dependent
// (if constexpr discards the v2 branch at head dims without a BwdV2Config).
template <typename Element, bool Causal, bool HasAlibi, bool HasSoftcap, bool IsDropoutRun,
          int HeadDim = EMU_HEAD_DIM>
void run_tile(BwdParams& params) {
    using namespace flash_cuda::sm80;
    using Config = BwdConfig<HeadDim>;
    // Dropout kernels (no softcap / ALiBi): bwd_dropout_traits_t, as the launcher.
    using Traits = std::conditional_t<
        HasAlibi || HasSoftcap, bias_traits_t<Config>,
        std::conditional_t<IsDropoutRun, bwd_dropout_traits_t<HeadDim>,
                           typename Config::Traits>>;
    // Same sequence as csrc/kernels/sm80/bwd_launch.cuh, on small grids. The preprocess on two
    // blocks: its grid-stride loops take the rest.
    launch(dim3(2), 256, 0, &mha_bwd_preprocess_kernel<Element, bwd_preprocess_lanes(HeadDim)>,
           params);
    const int n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const dim3 grid(params.deterministic ? params.num_splits : n_blocks, params.b, params.h);
    // The launcher's choice (bwd_launch.cuh): bwd_v2.cuh without dropout where the head dim has
    // a BwdV2Config (with -DFLASH_CUDA_EMU_BWD_TILE=n the tuning variant n of
    // bwd_tune_configs.h, as FLASH_CUDA_BWD_TILE=n in a tuning build).
    if constexpr (!IsDropoutRun && BwdV2Config<HeadDim>::kSupported) {
        using V2 = typename EmuV2<Element, HeadDim>::Traits;
        const int v2_blocks = (params.seqlen_k + V2::kBlockN - 1) / V2::kBlockN;
        const dim3 v2_grid(params.deterministic ? params.num_splits : v2_blocks, params.b,
                           params.h);
        launch(v2_grid, V2::kNThreads, V2::kSmemBytes,
               &mha_bwd_sm80_v2_kernel<Element, V2, Causal, HasAlibi, HasSoftcap>, params);
    } else {
        launch(grid, Traits::kNThreads, Traits::kSmemBytes,
               &mha_bwd_sm80_kernel<Element, Traits, Causal, HasAlibi, HasSoftcap, IsDropoutRun>,
               params);
    }
    // Grids (row chunks, heads) as bwd_launch.cuh; 4 chunks of 256 threads: grid-stride loops
    // cover the rest.
    launch(dim3(4, params.h), 256, 0, &mha_bwd_convert_dq_kernel<Element, HeadDim>, params);
    if (!params.dkv_direct) {
        launch(dim3(4, params.h_k), 256, 0, &mha_bwd_convert_dkv_kernel<Element, HeadDim>,
               params);
    }
}

#if EMU_HEAD_DIM == 64 || EMU_HEAD_DIM == 128 || EMU_HEAD_DIM == 192 || EMU_HEAD_DIM == 256
// The kernel of Traits (bwd_sm90_launch.cuh's choice: OrderedTraits where
// bwd_sm90_ordered_kernel says).
template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool IsDropout>
void run_sm90_kernel(BwdParams& params) {
    namespace s90 = flash_cuda::sm90;
    using namespace flash_cuda::sm80;
    s90::BwdTensorMaps maps;
    if (s90::make_bwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &maps) != 0) {
        std::fprintf(stderr, "emulation error: tensor maps rejected\n");
        std::exit(2);
    }
    std::printf("emulator: sm90 backward%s%s\n", Traits::kPingpong ? ", pingpong" : "",
                IsDropout ? ", dropout" : "");
    // Deterministic, as the host does for this kernel: one dq_accum slice, the semaphores zeroed.
    GuardedBuffer semaphores(
        params.deterministic ? 4 * params.b * params.h * (params.seqlen_q_rounded / 64) : 4, 0);
    if (params.deterministic) {
        params.num_splits = 1;
        params.dq_accum_split_stride = 0;
        params.dq_semaphore = reinterpret_cast<int*>(semaphores.data());
    }
    // The preprocess on two blocks: its grid-stride loops take the rest.
    launch(dim3(2), 256, 0,
           &mha_bwd_preprocess_kernel<Element, bwd_preprocess_lanes(Traits::kHeadDim)>, params);
    const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.b, params.h);
    emu::launch(grid, Traits::kNThreads, Traits::kSmemBytes, [&] {
        blockDim = dim3(Traits::kNThreads, 1, 1);
        s90::bwd_sm90_kernel<Element, Traits, Causal, HasAlibi, IsDropout>()(
            params, maps.q, maps.k, maps.v, maps.d_o, maps.dq_accum);
    });
    launch(dim3(4, params.h), 256, 0, &mha_bwd_convert_dq_kernel<Element, EMU_HEAD_DIM>, params);
    if (!params.dkv_direct) {
        launch(dim3(4, params.h_k), 256, 0, &mha_bwd_convert_dkv_kernel<Element, EMU_HEAD_DIM>,
               params);
    }
    if (!semaphores.guards_intact()) {
        std::fprintf(stderr, "emulation error: write outside the dq semaphores\n");
        std::exit(3);
    }
    // Every key-block CTA of a sequence passed every query block of it on: semaphore m of
    // (batch, head) ends at the sequence's number of key blocks.
    const bool varlen = params.cu_seqlens_q != nullptr;
    for (int bi = 0; params.deterministic && bi < params.b; ++bi) {
        const int lq = varlen ? params.cu_seqlens_q[bi + 1] - params.cu_seqlens_q[bi]
                              : params.seqlen_q;
        const int lk = varlen ? params.cu_seqlens_k[bi + 1] - params.cu_seqlens_k[bi]
                              : params.seqlen_k;
        for (int hi = 0; hi < params.h; ++hi) {
            const int* sem = params.dq_semaphore +
                             (static_cast<int64_t>(bi) * params.h + hi) *
                                 (params.seqlen_q_rounded / 64);
            // (at most the head's share: a max_seqlen_q below the sequence's length clamps)
            for (int m = 0; m < std::min((lq + 63) / 64, params.seqlen_q_rounded / 64); ++m) {
                if (sem[m] != (lk + Traits::kBlockN - 1) / Traits::kBlockN) {
                    std::fprintf(stderr, "emulation error: dq semaphore (%d, %d, %d) = %d\n", bi,
                                 hi, m, sem[m]);
                    std::exit(3);
                }
            }
        }
    }
}
#endif

// The sm90 backward (kernels/sm90/bwd_sm90.cuh) where it covers the call and the environment has
// EMU_SM90=1 (as flash_api.cpp with FLASH_CUDA_SM90=1 on an sm_90 GPU), between the same
// preprocess and convert kernels as the sm80 backward. False when it did not run.
template <typename Element, bool Causal, bool HasAlibi>
bool run_sm90(BwdParams& params) {
#if EMU_HEAD_DIM == 64 || EMU_HEAD_DIM == 128 || EMU_HEAD_DIM == 192 || EMU_HEAD_DIM == 256
    namespace s90 = flash_cuda::sm90;
    const char* want = std::getenv("EMU_SM90");
    if (want == nullptr || std::string(want) != "1" || !s90::bwd_supports(params) ||
        s90::bwd_kernel_head_dim(params.d) != EMU_HEAD_DIM) {
        return false;
    }
    using Config = s90::BwdSm90Config<EMU_HEAD_DIM>;
    // As the launcher: dropout without ALiBi (bwd_supports).
    auto go = [&](auto traits) {
        using T = typename decltype(traits)::type;
        if constexpr (!HasAlibi) {
            if (params.p_keep < 1.f) return run_sm90_kernel<Element, T, Causal, false, true>(params);
        }
        run_sm90_kernel<Element, T, Causal, HasAlibi, false>(params);
    };
    if (s90::bwd_sm90_ordered_kernel(params)) {
        go(std::type_identity<typename Config::OrderedTraits>{});
    } else {
        go(std::type_identity<typename Config::Traits>{});
    }
    return true;
#else
    (void)params;
    return false;
#endif
}

template <typename Element, bool Causal, bool HasAlibi, bool HasSoftcap>
void run(BwdParams& params) {
    if constexpr (!HasSoftcap) {
        if (run_sm90<Element, Causal, HasAlibi>(params)) return;
    }
    if (params.p_keep < 1.f) {
        run_tile<Element, Causal, HasAlibi, HasSoftcap, true>(params);
    } else {
        run_tile<Element, Causal, HasAlibi, HasSoftcap, false>(params);
    }
}

template <typename Element>
void run_dispatch(BwdParams& p) {
    const bool c = p.is_causal, a = p.alibi_slopes_ptr != nullptr, s = p.softcap > 0.f;
    if (c) {
        if (a && s) run<Element, true, true, true>(p);
        else if (a) run<Element, true, true, false>(p);
        else if (s) run<Element, true, false, true>(p);
        else run<Element, true, false, false>(p);
    } else {
        if (a && s) run<Element, false, true, true>(p);
        else if (a) run<Element, false, true, false>(p);
        else if (s) run<Element, false, false, true>(p);
        else run<Element, false, false, false>(p);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const std::map<std::string, std::string> kv = read_params(dir);
    auto geti = [&](const char* k) { return std::stoll(kv.at(k)); };
    auto getf = [&](const char* k) { return std::stof(kv.at(k)); };
    if (geti("hdim") != EMU_HEAD_DIM) {
        std::fprintf(stderr, "binary built for head dim %d\n", EMU_HEAD_DIM);
        return 2;
    }
    Input q, k, v, o, d_o, lse, alibi, cu_q, cu_k;
    if (!q.load(dir + "/q.bin") || !k.load(dir + "/k.bin") || !v.load(dir + "/v.bin") ||
        !o.load(dir + "/o.bin") || !d_o.load(dir + "/do.bin") || !lse.load(dir + "/lse.bin")) {
        std::fprintf(stderr, "missing inputs\n");
        return 2;
    }
    const bool has_alibi = alibi.load(dir + "/alibi.bin");
    const bool varlen = cu_q.load(dir + "/cu_seqlens_q.bin");
    if (varlen) cu_k.load(dir + "/cu_seqlens_k.bin");
    BwdParams p{};
    p.q_ptr = q.data + geti("q_offset") * 2;
    p.k_ptr = k.data + geti("k_offset") * 2;
    p.v_ptr = v.data + geti("v_offset") * 2;
    p.o_ptr = o.data + geti("o_offset") * 2;
    p.do_ptr = d_o.data + geti("do_offset") * 2;
    p.q_batch_stride = geti("q_batch_stride");
    p.k_batch_stride = geti("k_batch_stride");
    p.v_batch_stride = geti("v_batch_stride");
    p.o_batch_stride = geti("o_batch_stride");
    p.do_batch_stride = geti("do_batch_stride");
    p.q_row_stride = geti("q_row_stride");
    p.k_row_stride = geti("k_row_stride");
    p.v_row_stride = geti("v_row_stride");
    p.o_row_stride = geti("o_row_stride");
    p.do_row_stride = geti("do_row_stride");
    p.q_head_stride = geti("q_head_stride");
    p.k_head_stride = geti("k_head_stride");
    p.v_head_stride = geti("v_head_stride");
    p.o_head_stride = geti("o_head_stride");
    p.do_head_stride = geti("do_head_stride");
    p.b = geti("b");
    p.h = geti("h");
    p.h_k = geti("hk");
    p.h_h_k_ratio = p.h / p.h_k;
    p.seqlen_q = geti("sq");
    p.seqlen_k = geti("sk");
    p.seqlen_q_rounded = (p.seqlen_q + 127) / 128 * 128;
    p.seqlen_k_rounded = (p.seqlen_k + 127) / 128 * 128;
    p.total_q = geti("total_q");
    p.total_k = geti("total_k");
    p.d = geti("d");
    p.d_rounded = EMU_HEAD_DIM;
    set_score_scales(p, getf("scale"), getf("softcap"));
    p.window_size_left = geti("window_left");
    p.window_size_right = geti("window_right");
    p.is_causal = geti("causal") != 0;
    p.is_bf16 = kv.at("dtype") == "bf16";
    p.softmax_lse_ptr = reinterpret_cast<float*>(lse.data);
    if (has_alibi) {
        p.alibi_slopes_ptr = alibi.data;
        p.alibi_slopes_batch_stride = geti("alibi_batch_stride");
    }
    if (varlen) {
        p.cu_seqlens_q = reinterpret_cast<int*>(cu_q.data);
        p.cu_seqlens_k = reinterpret_cast<int*>(cu_k.data);
        p.unpadded_lse = true;
    }
    p.is_seqlens_k_cumulative = true;
    p.deterministic = geti("deterministic") != 0;
    p.num_splits = p.deterministic ? static_cast<int>(geti("splits")) : 1;
    // Dropout (dropout_params.h): the device-pointer path reads the forward's rng_state tensor.
    int64_t philox_values[2] = {0, 0};
    read_dropout_params(kv, p, philox_values, /*intragraph=*/0);

    const size_t b = p.b, h = p.h, hk = p.h_k, sq = p.seqlen_q, sk = p.seqlen_k, d = p.d;
    const size_t hd = EMU_HEAD_DIM;
    const size_t q_rows = varlen ? p.total_q : b * sq;        // rows of dq / dout
    const size_t k_rows = varlen ? p.total_k : b * sk;        // rows of dk / dv
    const size_t acc_rows = varlen ? h * p.total_q : b * h * p.seqlen_q_rounded;
    const size_t ws_rows = varlen ? h * p.total_k : b * h * p.seqlen_k_rounded;
    p.dq_accum_split_stride = p.deterministic ? static_cast<int64_t>(acc_rows * hd) : 0;
    // As the host does: MHA writes dk / dv directly (zeroed first when varlen), GQA through the
    // fp32 workspaces (zeroed when varlen).
    p.dkv_direct = p.h == p.h_k;
    const int dkv_fill = varlen && p.dkv_direct ? 0 : 0xFF;
    GuardedBuffer dq_accum(p.num_splits * acc_rows * hd * 4, 0);
    GuardedBuffer dk_accum(p.dkv_direct ? 4 : ws_rows * hd * 4, varlen ? 0 : 0xFF);
    GuardedBuffer dv_accum(p.dkv_direct ? 4 : ws_rows * hd * 4, varlen ? 0 : 0xFF);
    GuardedBuffer dsum(acc_rows * 4, 0xFF);
    GuardedBuffer dq(q_rows * h * d * 2, 0xFF), dk(k_rows * hk * d * 2, dkv_fill),
        dv(k_rows * hk * d * 2, dkv_fill);
    p.dq_accum_ptr = dq_accum.data();
    p.dk_accum_ptr = p.dkv_direct ? nullptr : dk_accum.data();
    p.dv_accum_ptr = p.dkv_direct ? nullptr : dv_accum.data();
    p.dsoftmax_sum = dsum.data();
    emu::readable_ranges().push_back({dsum.data(), dsum.size});  // the main kernel copies D in
    p.dq_ptr = dq.data();
    p.dk_ptr = dk.data();
    p.dv_ptr = dv.data();
    p.dq_batch_stride = varlen ? 0 : sq * h * d;
    p.dq_row_stride = h * d;
    p.dq_head_stride = d;
    p.dk_batch_stride = p.dv_batch_stride = varlen ? 0 : sk * hk * d;
    p.dk_row_stride = p.dv_row_stride = hk * d;
    p.dk_head_stride = p.dv_head_stride = d;

    if (p.is_bf16) {
        run_dispatch<__nv_bfloat16>(p);
    } else {
        run_dispatch<__half>(p);
    }
    for (GuardedBuffer* buf : {&dq_accum, &dk_accum, &dv_accum, &dsum, &dq, &dk, &dv}) {
        if (!buf->guards_intact()) {
            std::fprintf(stderr, "emulation error: write outside an output / workspace\n");
            return 3;
        }
    }
    write_file(dir + "/dq.bin", dq.data(), dq.size);
    write_file(dir + "/dk.bin", dk.data(), dk.size);
    write_file(dir + "/dv.bin", dv.data(), dv.size);
    return 0;
}
