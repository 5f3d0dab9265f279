"""Accelerators: memory, bandwidth, dense peak FLOP/s, links and a default price, from datasheets.

Units are in the field names. `hbm_bytes` is the marketed capacity in decimal bytes (80 GB =
80e9); `cuda_total_bytes` is what the CUDA runtime reports for it (`torch.cuda.mem_get_info`'s
total, the figure vLLM sizes the KV cache from), each with its source. FLOP/s are dense
tensor-core peaks, never the "with sparsity" figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError

GB = 10**9
TB = 10**12
GiB = 1 << 30


def _gib(x: float) -> int:
    """A total logged in GiB to two decimals (vLLM's and PyTorch's format), in bytes."""
    return round(x * GiB)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator.

    `hbm_bytes` is the marketed capacity in decimal bytes. `cuda_total_bytes` is the total the CUDA
    runtime reports (`cudaMemGetInfo`, printed by vLLM at start-up and by PyTorch's out-of-memory
    message): an "80 GB" H100 shows 79.22 GiB = 85.06e9 bytes, the board's memory less what the
    driver reserves. vLLM V1 takes `gpu_memory_utilization` of that total (`Worker.init_device`,
    vllm/v1/worker/gpu_worker.py), so KV capacities are computed from it; a pool's
    `gpu_memory_bytes` overrides it (the reference lesson's "80 GB" is 80e9).

    `fp8_flops` equals `bf16_flops` where the GPU has no FP8 tensor cores (`fp8_native` False):
    vLLM still runs FP8 checkpoints there (weight-only FP8 through Marlin kernels), at BF16 speed.
    `int8_ops` is the dense INT8 tensor-core peak, what W8A8 INT8 checkpoints compute at
    (`matmul_flops`).
    `interconnect_bytes_per_s` is one direction per GPU: NVLink / Infinity Fabric for SXM/OAM
    parts, the PCIe x16 link for PCIe cards.
    """

    id: str
    name: str
    hbm_bytes: int
    cuda_total_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    fp8_native: bool
    interconnect_bytes_per_s: float
    interconnect: str
    price_usd_per_gpu_hour: float
    int8_ops: float

    def __post_init__(self) -> None:
        for name in ("hbm_bytes", "cuda_total_bytes", "hbm_bandwidth_bytes_per_s", "bf16_flops", "fp8_flops",
                     "interconnect_bytes_per_s", "price_usd_per_gpu_hour", "int8_ops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not value > 0:
                raise ConfigError(f"gpu {self.id!r}: {name} must be positive, got {value!r}")
        if self.fp8_flops < self.bf16_flops or self.int8_ops < self.bf16_flops:
            raise ConfigError(f"gpu {self.id!r}: fp8_flops or int8_ops below bf16_flops")

    def matmul_flops(self, weight_dtype: str) -> float:
        """Dense peak of the matmuls of weights loaded as `weight_dtype` (a normalized name), as
        vLLM v0.15 runs them: FP8 W8A8 on FP8 tensor cores where the GPU has them (SM89+: CUTLASS
        `cutlass_scaled_mm`, `cutlass_fp8_supported` in quantization/utils/w8a8_utils.py), else
        weight-only through FP8 Marlin (`is_fp8_marlin_supported`: SM80+), which dequantizes to
        BF16; INT8 W8A8 on INT8 tensor cores (CUTLASS, SM75+; compressed-tensors
        `CompressedTensorsW8A8Int8`); every weight-only format (w8a16, AWQ / GPTQ through Marlin or
        Machete, MXFP4 experts through Marlin or triton matmul_ogs) at the BF16 peak. FP4 tensor
        cores (Blackwell NVFP4) are not modelled: BF16 too."""
        if weight_dtype == "fp8" and self.fp8_native:
            return self.fp8_flops
        if weight_dtype == "int8":
            return self.int8_ops
        return self.bf16_flops


def _g(spec: GpuSpec) -> tuple[str, GpuSpec]:
    return spec.id, spec


# Prices: rough on-demand list prices per GPU-hour at specialised GPU clouds (Lambda, RunPod,
# CoreWeave-style list prices, 2025); hyperscalers list 1.5-3x more. They are defaults for the
# cost metrics only; set `price_usd_per_gpu_hour` per pool for real numbers.
GPUS: dict[str, GpuSpec] = dict([
    # NVIDIA A100 Tensor Core GPU datasheet (2021): SXM4 40GB HBM2 1,555 GB/s; BF16 312 TFLOPS dense (624
    # sparse); INT8 624 TOPS dense (1,248 sparse); no FP8; NVLink 3 600 GB/s total = 300 GB/s each way. CUDA
    # total 39.50 GiB: PyTorch's out-of-memory message on an A100 40GB, "GPU 0 has a total capacity of 39.50
    # GiB" (TianheWu/CoSeR issue #10).
    _g(GpuSpec("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", 40 * GB, _gib(39.50), 1555 * GB, 312e12, 312e12, False,
               300 * GB, "NVLink 3", 1.29, int8_ops=624e12)),
    # Same datasheet: SXM4 80GB HBM2e 2,039 GB/s. CUDA total 79.32 GiB: vLLM's start-up check on two A100
    # 80GB, "Free memory on device (0.49/79.32 GiB)" (vllm-project/vllm-omni issue #276).
    _g(GpuSpec("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", 80 * GB, _gib(79.32), 2039 * GB, 312e12, 312e12, False,
               300 * GB, "NVLink 3", 1.79, int8_ops=624e12)),
    # NVIDIA H100 Tensor Core GPU datasheet: SXM5 80GB HBM3 3.35 TB/s; BF16 1,979 and FP8 3,958 TFLOPS with
    # sparsity, so 989.4 / 1,978.9 dense (INT8 3,958 TOPS sparse: 1,978.9 dense); NVLink 4 900 GB/s total =
    # 450 each way. CUDA total 79.22 GiB: vLLM's memory profile on H100 80GB HBM3, "total_gpu_memory
    # (79.22GiB)" (vllm-project/vllm PR #10511 and PR #12126); nvidia-smi shows 81,559 MiB (modal-client PR
    # #2797).
    _g(GpuSpec("h100-sxm-80gb", "NVIDIA H100 SXM5 80GB", 80 * GB, _gib(79.22), 3.35 * TB, 989.4e12, 1978.9e12, True,
               450 * GB, "NVLink 4", 2.99, int8_ops=1978.9e12)),
    # Same datasheet, H100 PCIe 80GB HBM2e 2.0 TB/s; BF16 1,513 / FP8 3,026 sparse -> 756 / 1,513 dense (INT8
    # the same as FP8); PCIe Gen5 x16 64 GB/s each way (the optional NVLink bridge is not assumed). CUDA
    # total: no log found; taken as the SXM part's 79.22 GiB (same 80 GB, same driver reservation).
    _g(GpuSpec("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 80 * GB, _gib(79.22), 2.0 * TB, 756.5e12, 1513e12, True,
               64 * GB, "PCIe Gen5 x16", 2.49, int8_ops=1513e12)),
    # NVIDIA H200 Tensor Core GPU datasheet: SXM 141GB HBM3e 4.8 TB/s; compute (INT8 too) as H100 SXM; NVLink
    # 4 900 GB/s total. CUDA total: no log found; 141e9 x (79.22 GiB / 80e9), the H100 SXM's ratio of reported
    # total to marketed size, = 139.63 GiB.
    _g(GpuSpec("h200-sxm-141gb", "NVIDIA H200 SXM 141GB", 141 * GB, round(141 * GB * _gib(79.22) / (80 * GB)),
               4.8 * TB, 989.4e12, 1978.9e12, True, 450 * GB, "NVLink 4", 3.79, int8_ops=1978.9e12)),
    # NVIDIA DGX B200 / HGX B200 datasheet: 1,440 GB HBM3e over 8 GPUs = 180 GB each, 8 TB/s each; HGX B200
    # lists 72 PFLOPS FP8 and 36 PFLOPS FP16/BF16 for 8 GPUs with sparsity, so 4.5 / 2.25 PFLOPS dense per GPU
    # (INT8 72 POPS sparse: 4.5 dense); NVLink 5 1.8 TB/s total = 900 GB/s each way. CUDA total 178.4 GiB:
    # `torch.cuda.mem_get_info()` on SM100, "free: 177.7 GiB / 178.4 GiB" (sgl-project/sglang issue #25225).
    _g(GpuSpec("b200-sxm-180gb", "NVIDIA B200 SXM 180GB", 180 * GB, _gib(178.4), 8.0 * TB, 2.25e15, 4.5e15, True,
               900 * GB, "NVLink 5", 5.99, int8_ops=4.5e15)),
    # NVIDIA L40S datasheet: 48GB GDDR6 864 GB/s; BF16 362.05 TFLOPS dense (733 sparse), FP8 733 dense (1,466
    # sparse), INT8 733 TOPS dense (1,466 sparse); PCIe Gen4 x16 32 GB/s each way, no NVLink. CUDA total 44.40
    # GiB: the L40's (same 48 GB GDDR6 board) PyTorch message "a total capacity of 44.40 GiB" (QwenLM/Qwen3-VL
    # issue #2097); no L40S log found. nvidia-smi shows the L40S's 46,068 MiB (modal-client PR #2797).
    _g(GpuSpec("l40s-48gb", "NVIDIA L40S 48GB", 48 * GB, _gib(44.40), 864 * GB, 362.05e12, 733e12, True,
               32 * GB, "PCIe Gen4 x16", 0.99, int8_ops=733e12)),
    # AMD Instinct MI300X data sheet: 192 GB HBM3 5.3 TB/s; BF16 1,307.4 TFLOPS dense, FP8 2,614.9 dense
    # (double with sparsity), INT8 2,614.9 TOPS dense; 7 Infinity Fabric links x 64 GB/s = 448 GB/s each way
    # (896 GB/s aggregate peer bandwidth). HIP total 191.98 GiB: rocminfo's VRAM pool on an MI300X, "Size:
    # 201310208(0xbffc000) KB" (ROCm/legacy-rocm-build issue #4414).
    _g(GpuSpec("mi300x-192gb", "AMD Instinct MI300X 192GB", 192 * GB, 201_310_208 * 1024, 5.3 * TB, 1307.4e12,
               2614.9e12, True, 448 * GB, "Infinity Fabric", 2.49, int8_ops=2614.9e12)),
])
