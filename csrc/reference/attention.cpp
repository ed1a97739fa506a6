// Reference fwd/bwd for fixed-length and varlen (packed, optionally paged) attention: layout
// plumbing around the blockwise core of blockwise.cpp.
#include <limits>
#include <vector>

#include "reference/blockwise.h"
#include "reference/reference.h"

namespace flash_cuda::reference {
namespace {

using namespace detail;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int64_t> host_ints(const Tensor& t) {
    const Tensor h = t.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = h.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + h.numel());
}

// Sequences of a varlen call: rows of q and keys of k for each.
struct VarlenSeqs {
    std::vector<int64_t> cu_q, cu_k, seqlen_k;
};

VarlenSeqs varlen_seqs(const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                       const OptTensor& seqused_k) {
    VarlenSeqs s;
    s.cu_q = host_ints(cu_seqlens_q);
    s.cu_k = host_ints(cu_seqlens_k);
    const int64_t batch = static_cast<int64_t>(s.cu_q.size()) - 1;
    s.seqlen_k.resize(batch);
    const std::vector<int64_t> used =
        seqused_k.has_value() ? host_ints(*seqused_k) : std::vector<int64_t>();
    for (int64_t i = 0; i < batch; ++i) {
        s.seqlen_k[i] = used.empty() ? s.cu_k[i + 1] - s.cu_k[i] : used[i];
    }
    return s;
}

// Keys of sequence i as (1, sk, hk, d): a slice of packed k, or gathered from the pages.
Tensor sequence_keys(const Tensor& k, const VarlenSeqs& s, const OptTensor& block_table,
                     int64_t i) {
    const int64_t sk = s.seqlen_k[i];
    if (!block_table.has_value()) return k.narrow(0, s.cu_k[i], sk).unsqueeze(0);
    const int64_t page = k.size(1);
    const int64_t blocks = (sk + page - 1) / page;
    const Tensor idx = block_table->select(0, i).narrow(0, 0, blocks).to(at::kLong);
    return k.index_select(0, idx)
        .reshape({blocks * page, k.size(2), k.size(3)})
        .narrow(0, 0, sk)
        .unsqueeze(0);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttnOptions& opts, bool return_softmax) {
    const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), hk = k.size(2);
    const Problem p = make_problem(q, k, v, opts.alibi_slopes, /*batch_offset=*/0);
    const RowsFwd r = forward(p, opts, /*need_out=*/true);
    Tensor out = at::empty(q.sizes(), q.options());
    copy_rows_to(r.out, out, hk);
    Tensor lse = lse_from_rows(r.lse, b, h, hk, sq).to(at::kFloat).contiguous();
    Tensor s_dmask = at::empty({0}, q.options());
    if (return_softmax) {
        s_dmask = at::zeros({b, h, round_up_128(sq), round_up_128(k.size(1))}, q.options());
        write_softmax(p, opts, r.lse, s_dmask);
    }
    return {out, lse, s_dmask};
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const AttnOptions& opts) {
    const int64_t hk = k.size(2);
    const Problem p = make_problem(q, k, v, opts.alibi_slopes, /*batch_offset=*/0);
    const at::ScalarType ct = p.q.scalar_type();
    const RowsBwd r = backward(p, opts, to_rows(dout, hk, ct), to_rows(out, hk, ct),
                               lse_to_rows(lse, hk, ct));
    Tensor dq = at::empty(q.sizes(), q.options());
    Tensor dk = at::empty(k.sizes(), k.options());
    Tensor dv = at::empty(v.sizes(), v.options());
    copy_rows_to(r.dq, dq, hk);
    copy_keys_to(r.dk, dk);
    copy_keys_to(r.dv, dv);
    return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& cu_seqlens_q,
                                              const Tensor& cu_seqlens_k,
                                              const OptTensor& seqused_k,
                                              const OptTensor& block_table, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, const AttnOptions& opts,
                                              bool return_softmax) {
    const int64_t total_q = q.size(0), h = q.size(1), hk = k.size(-2);
    const VarlenSeqs s = varlen_seqs(cu_seqlens_q, cu_seqlens_k, seqused_k);
    const int64_t batch = static_cast<int64_t>(s.seqlen_k.size());
    // Rows of q past cu_seqlens_q[-1] belong to no sequence: out 0, lse +inf.
    Tensor out = at::zeros(q.sizes(), q.options());
    Tensor lse = at::full({h, total_q}, kInf, q.options().dtype(at::kFloat));
    Tensor s_dmask = at::empty({0}, q.options());
    if (return_softmax) {
        s_dmask = at::zeros({batch, h, round_up_128(max_seqlen_q), round_up_128(max_seqlen_k)},
                            q.options());
    }
    for (int64_t i = 0; i < batch; ++i) {
        const int64_t q0 = s.cu_q[i], sq = s.cu_q[i + 1] - s.cu_q[i];
        if (sq == 0) continue;
        const Tensor qi = q.narrow(0, q0, sq).unsqueeze(0);
        const Problem p = make_problem(qi, sequence_keys(k, s, block_table, i),
                                       sequence_keys(v, s, block_table, i), opts.alibi_slopes, i);
        const RowsFwd r = forward(p, opts, /*need_out=*/true);
        copy_rows_to(r.out, out.narrow(0, q0, sq).unsqueeze(0), hk);
        lse.narrow(1, q0, sq).copy_(lse_from_rows(r.lse, 1, h, hk, sq).squeeze(0));
        if (return_softmax) write_softmax(p, opts, r.lse, s_dmask.narrow(0, i, 1));
    }
    return {out, lse, s_dmask};
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd(const Tensor& dout, const Tensor& q,
                                              const Tensor& k, const Tensor& v, const Tensor& out,
                                              const Tensor& lse, const Tensor& cu_seqlens_q,
                                              const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, const AttnOptions& opts) {
    (void)max_seqlen_q;
    (void)max_seqlen_k;
    const int64_t hk = k.size(1);
    const VarlenSeqs s = varlen_seqs(cu_seqlens_q, cu_seqlens_k, std::nullopt);
    const int64_t batch = static_cast<int64_t>(s.seqlen_k.size());
    Tensor dq = at::zeros(q.sizes(), q.options());
    Tensor dk = at::zeros(k.sizes(), k.options());
    Tensor dv = at::zeros(v.sizes(), v.options());
    for (int64_t i = 0; i < batch; ++i) {
        const int64_t q0 = s.cu_q[i], sq = s.cu_q[i + 1] - s.cu_q[i];
        const int64_t k0 = s.cu_k[i], sk = s.seqlen_k[i];
        if (sq == 0 || sk == 0) continue;  // no scores: all gradients of the sequence are 0
        const Tensor ki = k.narrow(0, k0, sk).unsqueeze(0);
        const Tensor vi = v.narrow(0, k0, sk).unsqueeze(0);
        const Problem p =
            make_problem(q.narrow(0, q0, sq).unsqueeze(0), ki, vi, opts.alibi_slopes, i);
        const at::ScalarType ct = p.q.scalar_type();
        const RowsBwd r = backward(
            p, opts, to_rows(dout.narrow(0, q0, sq).unsqueeze(0), hk, ct),
            to_rows(out.narrow(0, q0, sq).unsqueeze(0), hk, ct),
            lse_to_rows(lse.narrow(1, q0, sq).unsqueeze(0), hk, ct));
        copy_rows_to(r.dq, dq.narrow(0, q0, sq).unsqueeze(0), hk);
        copy_keys_to(r.dk, dk.narrow(0, k0, sk).unsqueeze(0));
        copy_keys_to(r.dv, dv.narrow(0, k0, sk).unsqueeze(0));
    }
    return {dq, dk, dv};
}

}  // namespace flash_cuda::reference
