"""A Hugging Face config.json read into a catalog ModelSpec: the file (config), the counting
code per architecture (arch, arch_moe) and the weight format of its quantization_config (quant)."""
