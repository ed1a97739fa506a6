import sys, torch
sys.path.insert(0, "tests")
from naive_attention import naive_attention
import flash_cuda
torch.manual_seed(0)
q, k, v = (torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.float16) for _ in range(3))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    out, lse = torch.ops.flash_cuda.fwd(q, k, v, None, 0.0, 128 ** -0.5, False, -1, -1, 2.0, False, None)[:2]
    torch.cuda.synchronize()
for e in prof.events():
    if "mha_fwd" in e.name: print(e.name[:300])
ref, ref_lse = naive_attention(q.double(), k.double(), v.double(), softmax_scale=128 ** -0.5, softcap=2.0)
print("err", (out.double()-ref).abs().max().item(), (lse.double()-ref_lse).abs().max().item())
