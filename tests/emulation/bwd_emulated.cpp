// Runs the sm80 backward kernels (csrc/kernels/sm80/bwd.cuh) on the CPU emulator (prelude.h).
//
//   bwd_emulated CASE_DIR
// CASE_DIR/params.txt: "key value" lines; q.bin, k.bin, v.bin, o.bin, do.bin: raw 16-bit
// storage (offsets / strides in params.txt); lse.bin: fp32 (b, h, sq) contiguous.
// Writes dq.bin (b, sq, h, d), dk.bin, dv.bin (b, sk, hk, d), contiguous, d = padded head dim.
// Output buffers and workspaces have guard zones, checked after the run.
// Build with -DEMU_HEAD_DIM=<kernel head dim>.
#include <atomic>
#include <fstream>
#include <map>
#include <string>

thread_local dim3 blockDim;
// fp32 atomicAdd of the device (the emulator runs a block's threads concurrently).
inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}

#include "kernels/sm80/bwd.cuh"
#include "host_io.h"

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

template <typename Element, bool Causal>
void run(BwdParams& params) {
    using namespace flash_cuda::sm80;
    using Traits = typename BwdConfig<EMU_HEAD_DIM>::Traits;
    // Same sequence as csrc/kernels/sm80/bwd_launch.cuh (small grids: one block per 256 threads
    // of work, grid-stride loops cover the rest).
    const long long rows = static_cast<long long>(params.b) * params.h * params.seqlen_q;
    launch(dim3(static_cast<unsigned>((rows * 32 + 255) / 256)), 256, 0,
           &mha_bwd_preprocess_kernel<Element>, params);
    const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.b, params.h);
    if (params.p_keep < 1.f) {
        launch(grid, Traits::kNThreads, Traits::kSmemBytes,
               &mha_bwd_sm80_kernel<Element, Traits, Causal, true>, params);
    } else {
        launch(grid, Traits::kNThreads, Traits::kSmemBytes,
               &mha_bwd_sm80_kernel<Element, Traits, Causal>, params);
    }
    launch(dim3(4), 256, 0, &mha_bwd_convert_dq_kernel<Element, EMU_HEAD_DIM>, params);
    launch(dim3(4), 256, 0, &mha_bwd_convert_dkv_kernel<Element, EMU_HEAD_DIM>, params);
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
    Input q, k, v, o, d_o, lse;
    if (!q.load(dir + "/q.bin") || !k.load(dir + "/k.bin") || !v.load(dir + "/v.bin") ||
        !o.load(dir + "/o.bin") || !d_o.load(dir + "/do.bin") || !lse.load(dir + "/lse.bin")) {
        std::fprintf(stderr, "missing inputs\n");
        return 2;
    }
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
    p.d = geti("d");
    p.d_rounded = EMU_HEAD_DIM;
    set_score_scales(p, getf("scale"), 0.f);
    p.window_size_left = geti("window_left");
    p.window_size_right = geti("window_right");
    p.is_causal = geti("causal") != 0;
    p.is_bf16 = kv.at("dtype") == "bf16";
    p.softmax_lse_ptr = reinterpret_cast<float*>(lse.data);
    // Dropout (optional keys): dropout_p, philox_seed, philox_offset; philox_on_device 1 reads
    // them through device pointers (the CUDA-graph path: the forward's rng_state tensor).
    p.p_keep = 1.f;
    p.rp_keep = 1.f;
    p.p_keep_threshold = 65536u;
    int64_t philox_values[2] = {0, 0};
    if (kv.count("dropout_p") && std::stod(kv.at("dropout_p")) > 0.0) {
        const double dropout_p = std::stod(kv.at("dropout_p"));
        p.p_keep = static_cast<float>(1.0 - dropout_p);
        p.p_keep_threshold = flash_cuda::dropout_keep_threshold(p.p_keep);
        p.rp_keep = static_cast<float>(1.0 / (1.0 - dropout_p));
        p.philox_seed = std::stoull(kv.at("philox_seed"));
        p.philox_offset = std::stoull(kv.at("philox_offset"));
        if (kv.count("philox_on_device") && geti("philox_on_device") != 0) {
            philox_values[0] = static_cast<int64_t>(p.philox_seed);
            philox_values[1] = static_cast<int64_t>(p.philox_offset);
            p.philox_seed_ptr = &philox_values[0];
            p.philox_offset_ptr = &philox_values[1];
            p.philox_seed = p.philox_offset = 0;  // must not be used
        }
    }

    const size_t b = p.b, h = p.h, hk = p.h_k, sq = p.seqlen_q, sk = p.seqlen_k, d = p.d;
    const size_t hd = EMU_HEAD_DIM;
    GuardedBuffer dq_accum(b * h * p.seqlen_q_rounded * hd * 4, 0);  // zeroed, as the host does
    GuardedBuffer dk_accum(b * h * p.seqlen_k_rounded * hd * 4, 0xFF);
    GuardedBuffer dv_accum(b * h * p.seqlen_k_rounded * hd * 4, 0xFF);
    GuardedBuffer dsum(b * h * p.seqlen_q_rounded * 4, 0xFF);
    GuardedBuffer dq(b * sq * h * d * 2, 0xFF), dk(b * sk * hk * d * 2, 0xFF), dv(b * sk * hk * d * 2, 0xFF);
    p.dq_accum_ptr = dq_accum.data();
    p.dk_accum_ptr = dk_accum.data();
    p.dv_accum_ptr = dv_accum.data();
    p.dsoftmax_sum = dsum.data();
    emu::readable_ranges().push_back({dsum.data(), dsum.size});  // the main kernel copies D in
    p.dq_ptr = dq.data();
    p.dk_ptr = dk.data();
    p.dv_ptr = dv.data();
    p.dq_batch_stride = sq * h * d;
    p.dq_row_stride = h * d;
    p.dq_head_stride = d;
    p.dk_batch_stride = p.dv_batch_stride = sk * hk * d;
    p.dk_row_stride = p.dv_row_stride = hk * d;
    p.dk_head_stride = p.dv_head_stride = d;

    const bool causal = p.is_causal;
    if (p.is_bf16) {
        causal ? run<__nv_bfloat16, true>(p) : run<__nv_bfloat16, false>(p);
    } else {
        causal ? run<__half, true>(p) : run<__half, false>(p);
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
