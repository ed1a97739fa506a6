// The dropout fields of a FwdParams / BwdParams from a case's params.txt (fwd_emulated.cpp,
// bwd_emulated.cpp). Optional keys: dropout_p, philox_seed, philox_offset, philox_on_device.
// philox_on_device 1 passes seed and offset through device pointers (the CUDA-graph path,
// torch's PhiloxCudaState): the pointed-to offset is `offset - intragraph` and
// params.philox_offset_intragraph = intragraph, so the kernel's sum is exercised.
// Include after the kernel headers (needs FwdParams and philox.cuh).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace emu_host {

// Returns whether the device-pointer path is on; `device_values` must outlive the launch.
inline bool read_dropout_params(const std::map<std::string, std::string>& kv,
                                flash_cuda::FwdParams& p, int64_t (&device_values)[2],
                                uint64_t intragraph) {
    p.p_keep = 1.f;
    p.rp_keep = 1.f;
    p.p_keep_threshold = 65536u;
    if (!kv.count("dropout_p") || !(std::stod(kv.at("dropout_p")) > 0.0)) return false;
    const double dropout_p = std::stod(kv.at("dropout_p"));
    p.p_keep = static_cast<float>(1.0 - dropout_p);
    p.p_keep_threshold = flash_cuda::dropout_keep_threshold(p.p_keep);
    p.rp_keep = static_cast<float>(1.0 / (1.0 - dropout_p));
    p.philox_seed = std::stoull(kv.at("philox_seed"));
    p.philox_offset = std::stoull(kv.at("philox_offset"));
    if (!kv.count("philox_on_device") || std::stoll(kv.at("philox_on_device")) == 0) return false;
    device_values[0] = static_cast<int64_t>(p.philox_seed);
    device_values[1] = static_cast<int64_t>(p.philox_offset - intragraph);
    p.philox_seed_ptr = &device_values[0];
    p.philox_offset_ptr = &device_values[1];
    p.philox_offset_intragraph = intragraph;
    p.philox_seed = p.philox_offset = 0;  // must not be used
    return true;
}

}  // namespace emu_host
