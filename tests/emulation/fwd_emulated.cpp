// Runs the sm80 forward kernel (csrc/kernels/sm80/fwd.cuh) on the CPU emulator (prelude.h).
//
//   fwd_emulated CASE_DIR
// CASE_DIR/params.txt: "key value" lines (see read_case); q.bin, k.bin, v.bin: raw 16-bit
// storage of the inputs (strides in params.txt); optional alibi.bin (fp32), cu_seqlens_q.bin,
// cu_seqlens_k.bin, seqused_k.bin (int32); KV cache / decode: block_table.bin (int32 (b, bt_cols),
// page size "page"), cache_batch_idx.bin, leftpad.bin (int32 (b)), "num_splits" (0 = the host
// heuristic of kernels/decode.h, as flash_api.cpp), "pack_gqa" (1: GQA packing where
// decode.h allows it, as the kvcache op), "kvcache_op" (1: the kvcache op's tile choice,
// decode.h plan_decode_tile) with "ring_device" (1: an sm_90 GPU, where the warp-specialised
// ring tiles may run). Split-KV partials are merged by the combine kernel
// (kernels/combine.cuh) on the emulator. Writes CASE_DIR/o.bin (contiguous, d_padded columns) and
// lse.bin (fp32). Exit status 0 on success; an out-of-bounds access aborts.
// Output buffers have guard zones filled with a sentinel, checked after the run.
// Build with -DEMU_HEAD_DIM=<kernel head dim> (one head dim per binary keeps compiles short).
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>

#include <cmath>
#include <vector>

#include "kernels/bias_flags.h"
#include "kernels/combine.cuh"
#include "kernels/decode.h"
#include "kernels/sm80/fwd.cuh"
#include "kernels/sm90/fwd_sm90_host.h"
// Head dims with an sm90 forward kernel (kernels/sm90/fwd_sm90_host.h fwd_kernel_head_dim).
#define EMU_HAS_SM90_FWD \
    (EMU_HEAD_DIM == 64 || EMU_HEAD_DIM == 128 || EMU_HEAD_DIM == 192 || EMU_HEAD_DIM == 256)
#if EMU_HAS_SM90_FWD
#include "kernels/sm90/fwd_sm90.cuh"
#endif
#include "host_io.h"
#include "dropout_params.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 gridDim;

namespace {

using flash_cuda::FwdParams;
using namespace emu_host;


template <typename Element, typename Traits, bool Causal>
void run_traits(FwdParams& params) {
    // The launcher's grid and divisors (fwd.cuh prepare_fwd_grid).
    auto grid_for = [&](auto traits) {
        return flash_cuda::sm80::prepare_fwd_grid<decltype(traits)>(params);
    };
    const dim3 grid = grid_for(Traits{});
    // Same variant choice as csrc/kernels/sm80/fwd_launch.cuh.
    const flash_cuda::ScoreBias bias = flash_cuda::fwd_score_bias(params);
    const bool has_softcap = bias.softcap, has_alibi = bias.alibi;
    auto go = [&](auto kernel) {
        emu::launch(grid, Traits::kLaunchThreads, Traits::kSmemBytes, [&] { kernel(params); });
    };
    using namespace flash_cuda::sm80;
    if constexpr (Traits::kKeySplit) {  // no dropout code: run() sends dropout elsewhere
        if (params.p_keep < 1.f) {
            std::fprintf(stderr, "the key-split tile has no dropout\n");
            std::exit(2);
        }
    } else if (params.p_keep < 1.f) {  // dropout: fwd_launch.cuh's dropout tile, bias flags too
        // The head dim's dropout tile; the decode tile keeps its own.
        using Config = FwdConfig<EMU_HEAD_DIM>;
        using DTraits = std::conditional_t<std::is_same_v<Traits, typename Config::Traits>,
                                           dropout_traits_t<Config>, Traits>;
        flash_cuda::with_bias_flags(has_softcap, has_alibi, [&](auto alibi, auto softcap) {
            emu::launch(grid_for(DTraits{}), DTraits::kLaunchThreads, DTraits::kSmemBytes, [&] {
                mha_fwd_sm80_kernel<Element, DTraits, Causal, decltype(alibi)::value,
                                    decltype(softcap)::value, true>(params);
            });
        });
        return;
    }
    if (has_softcap && has_alibi) go(&mha_fwd_sm80_kernel<Element, Traits, Causal, true, true>);
    else if (has_softcap) go(&mha_fwd_sm80_kernel<Element, Traits, Causal, false, true>);
    else if (has_alibi) go(&mha_fwd_sm80_kernel<Element, Traits, Causal, true, false>);
    else go(&mha_fwd_sm80_kernel<Element, Traits, Causal, false, false>);
}

#if EMU_HAS_SM90_FWD
// One sm90 forward call on the emulator with these traits (with_fwd_sm90_traits picks them, as
// for the launcher).
template <typename Element, bool Causal, typename Traits>
void run_sm90_traits(FwdParams& params) {
    namespace s90 = flash_cuda::sm90;
    s90::FwdTensorMaps maps;
    CUtensorMap o_map;
    if (s90::make_fwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &maps) != 0 ||
        s90::make_fwd_out_map(params, Traits::kStoreOByTma, &o_map) != 0) {
        std::fprintf(stderr, "emulation error: tensor maps rejected\n");
        std::exit(2);
    }
    std::printf("emulator: sm90 forward%s, key blocks of %d, O stored %s, %s tiles, a tail of "
                "%d pairs%s\n",
                Traits::kPingpong ? " (pingpong)" : "", Traits::kBlockN,
                Traits::kStoreOByTma ? "by TMA" : "from registers",
                params.sm90_tile_counter != nullptr ? "dynamic" : "fixed", params.sm90_tail_pairs,
                !Traits::carries_first_s(Causal)    ? ""
                : params.sm90_every_tile_has_work ? ", first S carried, before the tile's work"
                                                  : ", first S carried, after the tile's work");
    // A persistent grid of 3 CTAs (EMU_NUM_SMS) for every call, whatever the launcher's rule
    // (fwd_sm90_persistent: one CTA per tile for windows and varlen): the CTAs walk several
    // tiles, so the barrier rounds across tiles (causal: dynamic tiles, or the level order's snake
    // with FLASH_CUDA_SM90_DYNAMIC=0), windows and varlen included, run here.
    const char* sms = std::getenv("EMU_NUM_SMS");
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(
        s90::fwd_sm90_tiles(params), sms != nullptr ? std::atoi(sms) : 3)));
    if constexpr (Traits::kDropout) {  // as the launcher: without softcap / ALiBi
        std::printf("emulator: sm90 forward with dropout\n");
        emu::launch(grid, Traits::kNThreads, Traits::kSmemBytes, [&] {
            s90::mha_fwd_sm90_kernel<Element, Traits, Causal, false, false>(params, maps.q, maps.k,
                                                                            maps.v, o_map);
        });
    } else {
        const flash_cuda::ScoreBias bias = flash_cuda::fwd_score_bias(params);  // as the launcher
        flash_cuda::with_bias_flags(bias.softcap, bias.alibi, [&](auto alibi, auto softcap) {
            emu::launch(grid, Traits::kNThreads, Traits::kSmemBytes, [&] {
                s90::mha_fwd_sm90_kernel<Element, Traits, Causal, decltype(alibi)::value,
                                         decltype(softcap)::value>(params, maps.q, maps.k,
                                                                   maps.v, o_map);
            });
        });
    }
}
#endif

// The sm90 forward (kernels/sm90/fwd_sm90.cuh) where it covers the call and the environment has
// EMU_SM90=1 or =pingpong (as flash_api.cpp with FLASH_CUDA_SM90 on an sm_90 GPU). False when it
// did not run.
template <typename Element, bool Causal>
bool run_sm90(FwdParams& params) {
#if EMU_HAS_SM90_FWD
    namespace s90 = flash_cuda::sm90;
    const char* want = std::getenv("EMU_SM90");
    const std::string mode = want == nullptr ? "0" : want;
    if ((mode != "1" && mode != "pingpong") || !s90::fwd_supports(params) ||
        s90::fwd_kernel_head_dim(params.d) != EMU_HEAD_DIM) {
        return false;
    }
    params.sm90_pingpong = mode == "pingpong";  // as flash_api.cpp
    s90::prepare_fwd_sm90_divisors(params);      // as the launcher
    // Dynamic tiles as the launcher's rule (fwd_sm90_dynamic_tiles), the persistence being forced
    // here: every causal call without dropout unless FLASH_CUDA_SM90_DYNAMIC=0 (windows and
    // varlen too). The blocks run one after another, so block 0 takes every tile but the other
    // blocks' first ones, through many rounds of the ring.
    int tile_counter = 0;
    if (params.is_causal && params.p_keep >= 1.f &&
        flash_cuda::env_choice("FLASH_CUDA_SM90_DYNAMIC") != flash_cuda::EnvChoice::kOff) {
        params.sm90_tile_counter = &tile_counter;
    }
    params.sm90_tile_chunk =  // as the launcher, after the counter: an H100's L2 and SMs
        s90::fwd_sm90_tile_chunk(params, int64_t{50} << 20, s90::fwd_sm90_ctas(params, 132));
    params.sm90_tail_pairs =
        s90::fwd_sm90_tail_pairs(params, int64_t{50} << 20, s90::fwd_sm90_ctas(params, 132));
    s90::prepare_fwd_sm90_level_order(params);
    params.sm90_every_tile_has_work = s90::fwd_sm90_every_tile_has_work(params);
    s90::with_fwd_sm90_traits<EMU_HEAD_DIM, Causal>(params, [&](auto traits) {
        run_sm90_traits<Element, Causal, decltype(traits)>(params);
    });
    return true;
#else
    (void)params;
    return false;
#endif
}


// Tile choice of run_mha_fwd_sm80 (fwd_launch.cuh): the decode tile for short queries and paged
// caches (the only one with split-KV and paged loads), else the head dim's tile.
template <typename Element, bool Causal>
void run(FwdParams& params) {
    using namespace flash_cuda::sm80;
    if (run_sm90<Element, Causal>(params)) return;
    if (params.seqlen_q <= FwdDecodeConfig<EMU_HEAD_DIM>::kBlockM || params.block_table != nullptr ||
        params.gqa_pack > 1) {
        // The key-split tile (unless FLASH_CUDA_DECODE_KEYSPLIT=0): decode.h decode_tile and
        // with_keysplit_traits, as the launcher; the plain variant of a call without a block
        // table on the tile's twin without the paged path (decode.h contiguous_keysplit).
        if (params.head_group > 1) {  // decode.h plan_packing: the head-group twin
            const bool grouped = with_head_group_traits<EMU_HEAD_DIM>(
                flash_cuda::decode::decode_tile(params), [&](const char* what, auto tile) {
                    std::printf("emulator: key-split decode tile, %s (G %d), no paged path\n",
                                what, params.head_group);
                    run_traits<Element, typename decltype(tile)::type, Causal>(params);
                });
            if (!grouped) {
                std::fprintf(stderr, "no head-group tile at this head dim\n");
                std::exit(2);
            }
            return;
        }
        const flash_cuda::ScoreBias bias = flash_cuda::fwd_score_bias(params);
        const bool contiguous =
            flash_cuda::decode::contiguous_keysplit(params) && !bias.alibi && !bias.softcap;
        const bool keysplit = with_keysplit_traits<EMU_HEAD_DIM>(
            flash_cuda::decode::decode_tile(params), [&](const char* what, auto tile, auto plain) {
                std::printf("emulator: key-split decode tile, %s%s\n", what,
                            contiguous ? ", no paged path" : "");
                if (contiguous) {
                    run_traits<Element, typename decltype(plain)::type, Causal>(params);
                } else {
                    run_traits<Element, typename decltype(tile)::type, Causal>(params);
                }
            });
        if (keysplit) return;
        run_traits<Element, typename FwdDecodeConfig<EMU_HEAD_DIM>::Traits, Causal>(params);
    } else {
        if (params.num_splits > 1) {
            std::fprintf(stderr, "split-KV needs the decode tile\n");
            std::exit(2);
        }
        run_traits<Element, typename FwdConfig<EMU_HEAD_DIM>::Traits, Causal>(params);
    }
}

// kernels/combine.cuh, the combine kernel of the kvcache op, on the emulator (the launcher's
// choice of the float4 path: csrc/kernels/combine.cu).
template <typename Element>
void combine(const FwdParams& p) {
    namespace cb = flash_cuda::combine;
    const int64_t rows = static_cast<int64_t>(p.b) * p.h * p.seqlen_q;
    const bool vec4 = cb::vec4_layout(p);
    // The few-splits kernel (as combine.cu): its float4 bits are checked against the scalar warp
    // kernel's, whose reductions it repeats.
    const bool few = cb::few_splits_kernel(p, vec4);
    const cb::LaunchPlan plan =
        cb::launch_plan(rows, p.num_splits, !few && cb::row_kernel_enabled());
    std::printf("emulator: combine kernel (%s), %s path, %d splits, %d warps per CTA\n",
                few ? "few splits" : plan.row_kernel ? "CTA per row" : "warp per row",
                vec4 ? "float4" : "scalar", p.num_splits, plan.threads / 32);
    auto launch = [&](auto vec) {
        emu::launch(dim3(static_cast<unsigned>(plan.blocks)), plan.threads, plan.smem_bytes, [&] {
            if (few && decltype(vec)::value) {
                cb::combine_few_splits_kernel<Element>(p);
            } else if (plan.row_kernel) {
                cb::with_row_warps(plan.threads / 32, [&](auto warps) {
                    cb::combine_splits_row_kernel<Element, decltype(vec)::value, warps()>(p);
                });
            } else {
                cb::combine_splits_kernel<Element, decltype(vec)::value>(p);
            }
        });
    };
    if (!vec4) return launch(std::false_type{});
    // Both paths: the scalar one first, then the float4 one must write the same bits.
    launch(std::false_type{});
    auto out_row = [&](int64_t row) {
        const int64_t sq = p.seqlen_q, h = p.h;
        return static_cast<const Element*>(p.o_ptr) + (row / (h * sq)) * p.o_batch_stride +
               (row % sq) * p.o_row_stride + ((row / sq) % h) * p.o_head_stride;
    };
    std::vector<Element> scalar_o(static_cast<size_t>(rows) * p.d);
    std::vector<float> scalar_lse(p.softmax_lse_ptr, p.softmax_lse_ptr + rows);
    for (int64_t row = 0; row < rows; ++row) {
        std::memcpy(&scalar_o[row * p.d], out_row(row), p.d * sizeof(Element));
    }
    launch(std::true_type{});
    for (int64_t row = 0; row < rows; ++row) {
        if (std::memcmp(&scalar_o[row * p.d], out_row(row), p.d * sizeof(Element)) != 0 ||
            std::memcmp(&scalar_lse[row], p.softmax_lse_ptr + row, sizeof(float)) != 0) {
            std::fprintf(stderr, "emulation error: combine float4 and scalar paths differ "
                                 "(row %lld)\n", static_cast<long long>(row));
            std::exit(4);
        }
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
        std::fprintf(stderr, "binary built for head dim %d, case wants %lld\n", EMU_HEAD_DIM, geti("hdim"));
        return 2;
    }
    Input q, k, v, alibi, cu_q, cu_k, used_k;
    if (!q.load(dir + "/q.bin") || !k.load(dir + "/k.bin") || !v.load(dir + "/v.bin")) {
        std::fprintf(stderr, "missing q/k/v\n");
        return 2;
    }
    const bool has_alibi = alibi.load(dir + "/alibi.bin");
    const bool varlen = cu_q.load(dir + "/cu_seqlens_q.bin");
    if (varlen) cu_k.load(dir + "/cu_seqlens_k.bin");
    const bool has_used = used_k.load(dir + "/seqused_k.bin");
    Input block_table, batch_idx, leftpad;
    const bool paged = block_table.load(dir + "/block_table.bin");
    const bool has_batch_idx = batch_idx.load(dir + "/cache_batch_idx.bin");
    const bool has_leftpad = leftpad.load(dir + "/leftpad.bin");
    auto geti_or = [&](const char* k, long long dflt) {
        return kv.count(k) ? std::stoll(kv.at(k)) : dflt;
    };

    FwdParams p{};
    p.q_ptr = q.data + geti("q_offset") * 2;
    p.k_ptr = k.data + geti("k_offset") * 2;
    p.v_ptr = v.data + geti("v_offset") * 2;
    p.q_batch_stride = geti("q_batch_stride");
    p.k_batch_stride = geti("k_batch_stride");
    p.v_batch_stride = geti("v_batch_stride");
    p.q_row_stride = geti("q_row_stride");
    p.k_row_stride = geti("k_row_stride");
    p.v_row_stride = geti("v_row_stride");
    p.q_head_stride = geti("q_head_stride");
    p.k_head_stride = geti("k_head_stride");
    p.v_head_stride = geti("v_head_stride");
    p.b = geti("b");
    p.h = geti("h");
    p.h_k = geti("hk");
    p.h_h_k_ratio = p.h / p.h_k;
    p.seqlen_q = geti("sq");  // varlen: max
    p.seqlen_k = geti("sk");
    p.d = geti("d");
    p.d_rounded = EMU_HEAD_DIM;
    p.total_q = geti("total_q");
    p.total_k = static_cast<int>(geti_or("total_k", 0));
    set_score_scales(p, getf("scale"), getf("softcap"));
    p.window_size_left = geti("window_left");
    p.window_size_right = geti("window_right");
    p.is_causal = geti("causal") != 0;
    p.is_bf16 = kv.at("dtype") == "bf16";
    p.num_splits = 1;
    if (has_alibi) {
        p.alibi_slopes_ptr = alibi.data;
        p.alibi_slopes_batch_stride = geti("alibi_batch_stride");
    }
    if (varlen) {
        p.cu_seqlens_q = reinterpret_cast<int*>(cu_q.data);
        p.cu_seqlens_k = reinterpret_cast<int*>(cu_k.data);
        p.unpadded_lse = true;
    }
    if (has_used) p.seqused_k = reinterpret_cast<int*>(used_k.data);
    p.is_seqlens_k_cumulative = true;
    if (paged) {
        p.block_table = reinterpret_cast<int*>(block_table.data);
        p.block_table_batch_stride = geti("bt_cols");
        p.page_block_size = geti("page");
        p.block_table_cols = geti("bt_cols");
        p.num_pages = static_cast<int>(geti_or("num_pages", 0));
    }
    if (has_batch_idx) {
        p.cache_batch_idx = reinterpret_cast<int*>(batch_idx.data);
        p.kv_cache_rows = static_cast<int>(geti_or("kv_cache_rows", 0));
    }
    if (has_leftpad) p.leftpad_k = reinterpret_cast<int*>(leftpad.data);
    // Dropout (dropout_params.h); with the device-pointer path the kernel also writes rng_state.
    int64_t philox_values[2] = {0, 0};
    int64_t rng_state_out[2] = {-1, -1};
    if (read_dropout_params(kv, p, philox_values, /*intragraph=*/5)) p.rng_state = rng_state_out;

    // Output: contiguous (b, sq, h, d) or (total_q, h, d); lse (b, h, sq) or (h, total_q).
    const long long rows = varlen ? p.total_q : static_cast<long long>(p.b) * p.seqlen_q;
    const size_t o_elems = static_cast<size_t>(rows) * p.h * p.d;
    const size_t lse_elems = varlen ? static_cast<size_t>(p.h) * p.total_q
                                    : static_cast<size_t>(p.b) * p.h * p.seqlen_q;
    GuardedBuffer o(o_elems * 2, 0xFF), lse(lse_elems * 4, 0xFF);  // NaN-filled
    p.o_ptr = o.data();
    p.o_row_stride = static_cast<int64_t>(p.h) * p.d;
    p.o_head_stride = p.d;
    p.o_batch_stride = varlen ? 0 : static_cast<int64_t>(p.seqlen_q) * p.h * p.d;
    p.softmax_lse_ptr = reinterpret_cast<float*>(lse.data());

    // The kvcache op's host steps (flash_api.cpp): GQA packing, split count.
    const int num_sms = static_cast<int>(geti_or("num_sms", 132));
    if (geti_or("pack_gqa", 0) != 0) {
        flash_cuda::decode::plan_packing(p, num_sms, geti_or("ring_device", 0) != 0);
    }
    if (geti_or("kvcache_op", 0) != 0) {
        flash_cuda::decode::plan_decode_tile(p, num_sms, geti_or("ring_device", 0) != 0);
    }
    const bool decode_tile = flash_cuda::decode::uses_decode_tile(p);
    p.num_splits = flash_cuda::decode::num_splits(static_cast<int>(geti_or("num_splits", 1)),
                                                  flash_cuda::decode::num_tiles(p),
                                                  flash_cuda::decode::key_columns(p),
                                                  decode_tile, flash_cuda::decode::split_geometry(p),
                                                  num_sms);
    if (geti_or("kvcache_op", 0) != 0) {
        flash_cuda::decode::plan_kv_overlap(p, num_sms, geti_or("ring_device", 0) != 0);
    }
    const size_t partial_rows =
        static_cast<size_t>(p.num_splits) * p.b * p.h * std::max(p.seqlen_q, 0);
    GuardedBuffer o_acc(partial_rows * p.d_rounded * 4, 0xFF), lse_acc(partial_rows * 4, 0xFF);
    if (p.num_splits > 1) {
        p.oaccum_ptr = o_acc.data();
        p.softmax_lseaccum_ptr = reinterpret_cast<float*>(lse_acc.data());
    }
    std::printf("emulator: seqlen_q %d h %d gqa_pack %d num_splits %d decode_tile %d\n",
                p.seqlen_q, p.h, p.gqa_pack, p.num_splits, static_cast<int>(decode_tile));

    if (p.seqlen_q > 0 && p.b > 0) {
        const bool causal = p.is_causal;
        if (p.is_bf16) {
            causal ? run<__nv_bfloat16, true>(p) : run<__nv_bfloat16, false>(p);
            if (p.num_splits > 1) combine<__nv_bfloat16>(p);
        } else {
            causal ? run<__half, true>(p) : run<__half, false>(p);
            if (p.num_splits > 1) combine<__half>(p);
        }
    }
    if (!o_acc.guards_intact() || !lse_acc.guards_intact()) {
        std::fprintf(stderr, "emulation error: write outside oaccum / lseaccum\n");
        return 3;
    }
    if (!o.guards_intact() || !lse.guards_intact()) {
        std::fprintf(stderr, "emulation error: write outside o / lse\n");
        return 3;
    }
    write_file(dir + "/rng_state.bin", rng_state_out, sizeof(rng_state_out));
    write_file(dir + "/o.bin", o.data(), o.size);
    write_file(dir + "/lse.bin", lse.data(), lse.size);
    return 0;
}
