// Scalar conversions between the 16-bit element types and fp32 (round to nearest even), shared
// by the kernels that read or write single elements (backward postprocess, combine, KV-cache
// append). The tensor-core paths convert pairs with ptx::pack_float2 instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flash_cuda {

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Element>
__device__ __forceinline__ Element from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

}  // namespace flash_cuda
