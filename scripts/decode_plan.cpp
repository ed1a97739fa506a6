// The decode plan of issue 5's grid under csrc/kernels/decode.h, as flash_api.cpp makes it for
// the kvcache op: which tile runs, its key block, the CTAs per SM the split count assumes, the
// tiles and the split count. Host code only (no GPU): ties a benchmark cell to the plan it ran,
// and shows which cells a rule change moves (diff two outputs).
//
//   g++ -std=c++17 -Icsrc scripts/decode_plan.cpp -o /tmp/decode_plan && /tmp/decode_plan [SMS [sm90]]
//
// SMS: the device's SM count (132: the H200); a second argument "sm90": the plan of a compute
// capability 9.0 GPU (the warp-specialised ring tiles, decode.h plan_decode_tile), else of an
// older one. The A/B switches of decode.h (FLASH_CUDA_DECODE_KEYSPLIT, FLASH_CUDA_DECODE_KV128,
// FLASH_CUDA_DECODE_RING, ...) apply as in the library.
// One line per cell: "d128 contiguous q1 h32/8 b1 kv1024: keysplit16 kb64 ctas/sm 1 tiles 8
// splits 8 ctas 64"; "paged" is a cache of 16-key pages (issue 5's), "paged64" of 64-key ones.
// tests/test_decode_plan.py pins the plans the benchmarks measured.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/decode.h"

namespace {

using flash_cuda::FwdParams;
namespace decode = flash_cuda::decode;

const char* tile_name(const FwdParams& p) {
    if (!decode::uses_decode_tile(p)) return "128row";
    switch (decode::decode_tile(p)) {
        case decode::DecodeTile::kKeySplit16: return "keysplit16";
        case decode::DecodeTile::kKeySplit16Wide: return "keysplit16-kv128";
        case decode::DecodeTile::kKeySplit16WideOverlap: return "keysplit16-kv128-overlap";
        case decode::DecodeTile::kKeySplit32: return "keysplit32";
        case decode::DecodeTile::kKeySplit32Wide: return "keysplit32-kv128";
        case decode::DecodeTile::kRing16: return "ring16";
        case decode::DecodeTile::kRing32: return "ring32";
        case decode::DecodeTile::kDecode64: break;
    }
    return "decode64";
}

// flash_api.cpp mha_fwd_kvcache_cuda's host steps for one decode step (no ALiBi, no window).
void print_plan(int d, int page, int seqlen_q, int h, int h_k, int b, int seqlen_k, int num_sms,
                bool ring_device) {
    FwdParams p;
    std::memset(&p, 0, sizeof(p));
    p.b = b;
    p.h = h;
    p.h_k = h_k;
    p.h_h_k_ratio = h / h_k;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.d = d;
    p.d_rounded = d;
    p.p_keep = 1.f;
    p.window_size_left = -1;
    p.window_size_right = -1;
    p.scale_softmax = 1.f / std::sqrt(static_cast<float>(d));  // plain: no ALiBi, no softcap
    p.q_head_stride = d;  // (b, s, h, d) contiguous
    p.o_head_stride = d;
    p.k_head_stride = d;
    p.v_head_stride = d;
    static int fake_table;  // only its presence matters to the plan
    if (page > 0) {
        p.block_table = &fake_table;
        p.page_block_size = page;
    }
    decode::plan_packing(p, num_sms, ring_device);
    decode::plan_decode_tile(p, num_sms, ring_device);
    const decode::SplitGeometry geometry = decode::split_geometry(p);
    const int64_t tiles = decode::num_tiles(p);
    const int splits = decode::num_splits(0, tiles, decode::key_columns(p),
                                          decode::uses_decode_tile(p), geometry, num_sms);
    p.num_splits = splits;
    decode::plan_kv_overlap(p, num_sms, ring_device);
    char tile[64];
    if (p.head_group > 1) {
        std::snprintf(tile, sizeof(tile), "%s-hg%d", tile_name(p), p.head_group);
    } else {
        std::snprintf(tile, sizeof(tile), "%s", tile_name(p));
    }
    std::printf("d%d %s q%d h%d/%d b%d kv%d: %s kb%d ctas/sm %d tiles %lld splits %d ctas %lld\n",
                d, page == 0 ? "contiguous" : page == 16 ? "paged" : "paged64", seqlen_q, h, h_k,
                b, seqlen_k, tile, geometry.key_block, geometry.ctas_per_sm,
                static_cast<long long>(tiles), splits, static_cast<long long>(tiles * splits));
}

}  // namespace

int main(int argc, char** argv) {
    const int num_sms = argc > 1 ? std::atoi(argv[1]) : 132;
    const bool ring_device = argc > 2 && std::strcmp(argv[2], "sm90") == 0;
    constexpr double kMaxBytes = 40e9;  // bench_plan.py DECODE_GRID_MAX_GB: larger cells skipped
    for (int d : {64, 96, 128, 256}) {
        for (int page : {0, 16, 64}) {
            for (int seqlen_q : {1, 4, 8}) {
                for (int h_k : {8, 32, 1}) {
                    for (int b : {1, 8, 32, 128}) {
                        for (int seqlen_k : {1024, 8192, 32768, 131072}) {
                            if (2.0 * b * seqlen_k * h_k * d * 2 > kMaxBytes) continue;
                            print_plan(d, page, seqlen_q, 32, h_k, b, seqlen_k, num_sms,
                                       ring_device);
                        }
                    }
                }
            }
        }
    }
    return 0;
}
