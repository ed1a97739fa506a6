// Runs the KV-cache append kernel (csrc/kernels/kvcache_append.cuh) on the CPU.
//
//   kvcache_append_emulated CASE_DIR
// CASE_DIR/params.txt: "key value" lines, the KvAppendParams fields by name plus is_bf16, grid
// (blocks; 0 = the launcher's choice) and, per 16-bit tensor NAME of knew, vnew, kcache, vcache,
// q: NAME_offset (storage offset, elements). Files: NAME.bin (raw 16-bit storage), cos.bin and
// sin.bin (16-bit), cache_seqlens.bin, cache_batch_idx.bin, block_table.bin (int32; each
// optional). Writes kcache.out.bin, vcache.out.bin (the storages after the append) and, with
// rotary, qrot.bin (contiguous (b, seqlen_q, h, d)), and with new tokens and cache_seqlens
// seqlens.out.bin (int32 (b): KvAppendParams::seqlens_out). Exit status 0 on success.
//
// The kernel uses no barrier or warp-collective instruction, so the threads of the grid run one
// after another on one host thread. Inputs are held in exact-size heap buffers (build with
// -fsanitize=address to catch reads out of bounds); the caches and qrot have guard zones,
// checked after the run (writes out of bounds), and qrot starts as NaN (unwritten elements).
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "kernels/kvcache_append.cuh"
#include "host_io.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 gridDim;

namespace {

using flash_cuda::KvAppendParams;
using namespace emu_host;

// An input file in a heap buffer of exactly its size (empty file or none: nullptr).
struct ExactInput {
    std::unique_ptr<unsigned char[]> data;
    size_t size = 0;
    bool load(const std::string& path) {
        const std::vector<unsigned char> file = read_file(path);
        if (file.empty()) return false;
        size = file.size();
        data.reset(new unsigned char[size]);
        std::memcpy(data.get(), file.data(), size);
        return true;
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const std::map<std::string, std::string> kv = read_params(dir);
    auto geti = [&](const char* k) { return std::stoll(kv.at(k)); };

    KvAppendParams p{};
    p.b = geti("b");
    p.seqlen_new = geti("seqlen_new");
    p.h_k = geti("h_k");
    p.d = geti("d");
    p.knew_batch_stride = geti("knew_batch_stride");
    p.knew_row_stride = geti("knew_row_stride");
    p.knew_head_stride = geti("knew_head_stride");
    p.vnew_batch_stride = geti("vnew_batch_stride");
    p.vnew_row_stride = geti("vnew_row_stride");
    p.vnew_head_stride = geti("vnew_head_stride");
    p.kcache_batch_stride = geti("kcache_batch_stride");
    p.kcache_row_stride = geti("kcache_row_stride");
    p.kcache_head_stride = geti("kcache_head_stride");
    p.vcache_batch_stride = geti("vcache_batch_stride");
    p.vcache_row_stride = geti("vcache_row_stride");
    p.vcache_head_stride = geti("vcache_head_stride");
    p.cache_batch = geti("cache_batch");
    p.capacity = geti("capacity");
    p.block_table_batch_stride = geti("block_table_batch_stride");
    p.max_blocks = geti("max_blocks");
    p.page_size = geti("page_size");
    p.rotary_dim = geti("rotary_dim");
    p.seqlen_ro = geti("seqlen_ro");
    p.rotary_interleaved = geti("rotary_interleaved") != 0;
    p.q_positions_per_row = geti("q_positions_per_row") != 0;
    p.q_batch_stride = geti("q_batch_stride");
    p.q_row_stride = geti("q_row_stride");
    p.q_head_stride = geti("q_head_stride");
    p.seqlen_q = geti("seqlen_q");
    p.h = geti("h");
    const bool is_bf16 = geti("is_bf16") != 0;

    ExactInput knew, vnew, q, cos, sin, seqlens, batch_idx, table;
    knew.load(dir + "/knew.bin");
    vnew.load(dir + "/vnew.bin");
    q.load(dir + "/q.bin");
    cos.load(dir + "/cos.bin");
    sin.load(dir + "/sin.bin");
    auto elem = [](ExactInput& in, long long offset) -> void* {
        return in.data ? in.data.get() + 2 * offset : nullptr;
    };
    p.knew_ptr = elem(knew, geti("knew_offset"));
    p.vnew_ptr = elem(vnew, geti("vnew_offset"));
    p.q_ptr = elem(q, geti("q_offset"));
    p.rotary_cos_ptr = elem(cos, 0);
    p.rotary_sin_ptr = elem(sin, 0);
    if (seqlens.load(dir + "/cache_seqlens.bin")) {
        p.cache_seqlens = reinterpret_cast<const int*>(seqlens.data.get());
    }
    if (batch_idx.load(dir + "/cache_batch_idx.bin")) {
        p.cache_batch_idx = reinterpret_cast<const int*>(batch_idx.data.get());
    }
    if (table.load(dir + "/block_table.bin")) {
        p.block_table = reinterpret_cast<const int*>(table.data.get());
    }

    // Caches: the storage in a guarded buffer, updated in place.
    const std::vector<unsigned char> kfile = read_file(dir + "/kcache.bin");
    const std::vector<unsigned char> vfile = read_file(dir + "/vcache.bin");
    GuardedBuffer kcache(kfile.size(), 0), vcache(vfile.size(), 0);
    std::memcpy(kcache.data(), kfile.data(), kfile.size());
    std::memcpy(vcache.data(), vfile.data(), vfile.size());
    p.kcache_ptr = kcache.data() + 2 * geti("kcache_offset");
    p.vcache_ptr = vcache.data() + 2 * geti("vcache_offset");

    const size_t qrot_elems = p.rotary_dim > 0 ? size_t(p.b) * p.seqlen_q * p.h * p.d : 0;
    GuardedBuffer qrot(2 * qrot_elems, 0xFF);  // NaN in fp16 and bf16
    p.qrot_ptr = qrot.data();
    p.qrot_head_stride = p.d;
    p.qrot_row_stride = int64_t(p.h) * p.d;
    p.qrot_batch_stride = int64_t(p.seqlen_q) * p.h * p.d;

    // The attention's key counts (cache_seqlens + seqlen_new), as the host asks for them when
    // it appends; poisoned (-1) first.
    const bool want_seqlens = p.seqlen_new > 0 && p.cache_seqlens != nullptr && p.b > 0;
    GuardedBuffer seqlens_out(want_seqlens ? 4 * size_t(p.b) : 0, 0xFF);
    if (want_seqlens) p.seqlens_out = reinterpret_cast<int*>(seqlens_out.data());

    using namespace flash_cuda::kvcache_append;
    const int64_t rows = kv_rows(p) + q_rows(p);
    int64_t blocks = geti("grid");
    if (blocks <= 0) {  // the launcher's choice (kvcache_append.cu)
        blocks = std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, 1 << 16);
    }
    if ((rows > 0 && p.d > 0) || want_seqlens) {
        gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
        for (int64_t x = 0; x < blocks; ++x) {
            for (int t = 0; t < kThreads; ++t) {
                blockIdx = make_uint3(static_cast<unsigned>(x), 0, 0);
                threadIdx = make_uint3(t, 0, 0);
                if (is_bf16) {
                    kvcache_append_kernel<__nv_bfloat16>(p);
                } else {
                    kvcache_append_kernel<__half>(p);
                }
            }
        }
    }
    if (!kcache.guards_intact() || !vcache.guards_intact() || !qrot.guards_intact() ||
        !seqlens_out.guards_intact()) {
        std::fprintf(stderr, "emulation error: write outside the caches, qrot or seqlens_out\n");
        return 1;
    }
    if (want_seqlens) write_file(dir + "/seqlens.out.bin", seqlens_out.data(), seqlens_out.size);
    write_file(dir + "/kcache.out.bin", kcache.data(), kcache.size);
    write_file(dir + "/vcache.out.bin", vcache.data(), vcache.size);
    if (qrot_elems > 0) write_file(dir + "/qrot.bin", qrot.data(), qrot.size);
    std::printf("rows %lld blocks %lld\n", static_cast<long long>(rows), static_cast<long long>(blocks));
    return 0;
}
