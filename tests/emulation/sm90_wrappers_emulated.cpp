// CPU run of the sm_90a wrapper checks (tests/cuda/sm90_wrapper_kernels.cuh) on the emulated
// Hopper instructions (kernels/sm90/ptx_sm90.cuh here): the same kernels and expectations as the
// GPU program tests/cuda/test_sm90_wrappers.cu. Passing here checks the kernels' protocol
// (barrier counts, parities, transaction bytes, descriptors) against the emulator's reading of
// the PTX ISA; the GPU program checks that reading against the hardware.
// Built and run by tests/test_sm90_wrappers.py; prints one line per check and "N failure(s)".
#include <cstdio>

#include "kernels/sm90/tensor_map.h"
#include "sm90_wrapper_kernels.cuh"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 gridDim;

using namespace sm90_check;

static int g_failures = 0;
static void report(const char* name, bool ok) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) ++g_failures;
}

template <typename T>
static void readable(const std::vector<T>& v) {
    emu::readable_ranges().push_back({v.data(), v.size() * sizeof(T)});
}

static CUtensorMap tile_map(const void* base, int rows) {
    flash_cuda::sm90::TensorMap2d m;
    m.base = base;
    m.cols = kTile;
    m.rows = rows;
    m.row_stride_bytes = kTile * 2;
    m.box_cols = kTile;
    m.box_rows = kTile;
    CUtensorMap map;
    if (flash_cuda::sm90::encode_tensor_map_2d(&map, m) != 0) {
        std::printf("tensor map rejected\n");
        std::exit(2);
    }
    return map;
}

int main() {
    int timed_out = 0;
    const dim3 one(1, 1, 1);
    {  // 1. bulk copy
        alignas(16) static uint32_t src[kBulkBytes / 4];
        const std::vector<uint32_t> host = bulk_pattern();
        std::copy(host.begin(), host.end(), src);
        emu::readable_ranges().push_back({src, sizeof(src)});
        alignas(16) static uint32_t dst[kBulkBytes / 4];
        emu::launch(one, kThreads, kSmemBytes, [&] {
            bulk_copy_kernel(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst),
                             &timed_out);
        });
        report("mbarrier wait completes (bulk copy)", timed_out == 0);
        report("cp.async.bulk 16 KB global -> shared",
               std::vector<uint32_t>(dst, dst + kBulkBytes / 4) == host);
    }

    const Inputs in;
    readable(in.a);
    readable(in.b);
    const CUtensorMap a_map = tile_map(in.a.data(), 2 * kTile), b_map = tile_map(in.b.data(), kTile);

    {  // 2. TMA load of the second 64-row box of A
        std::vector<uint8_t> image(kTileBytes, 0);
        timed_out = 0;
        emu::launch(one, kThreads, kSmemBytes, [&] { tma_kernel(a_map, kTile, image.data(), &timed_out); });
        const int bad = first_misplaced(image, in, kTile);
        if (bad >= 0) std::printf("  TMA image: element %d not at its swizzled offset\n", bad);
        report("mbarrier wait completes (TMA 2D)", timed_out == 0);
        report("TMA 2D load, 128-byte swizzle = sw128_offset", bad < 0);
    }

    const std::vector<float> ref = in.ref(true);
    for (int via_tma = 0; via_tma < 2; ++via_tma) {  // 3. wgmma SS
        std::vector<float> d(kTile * kTile, NAN);
        timed_out = 0;
        emu::launch(one, kThreads, kSmemBytes, [&] {
            wgmma_kernel(in.a.data(), in.b.data(), a_map, b_map, via_tma != 0, d.data(), &timed_out);
        });
        const double err = max_error(d, ref);
        std::printf("  wgmma (%s operands): max |D - ref| = %g\n", via_tma ? "TMA" : "st.shared",
                    err);
        report(via_tma ? "wgmma m64n64k16 x4, TMA-loaded operands"
                       : "wgmma m64n64k16 x4, st.shared operands",
               err <= 1e-3 && timed_out == 0);
    }

    {  // 4. wgmma RS, MN-major B
        std::vector<float> o(kTile * kTile, NAN);
        emu::launch(one, kThreads, kSmemBytes, [&] { wgmma_rs_kernel(in.a.data(), in.b.data(), o.data()); });
        const double err = max_error(o, in.ref(false));
        std::printf("  wgmma RS (P V, MN-major V): max |O - ref| = %g\n", err);
        report("wgmma m64n64k16 RS x4, MN-major B (transposed descriptor)", err <= 1e-3);
    }

    std::printf("%d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
