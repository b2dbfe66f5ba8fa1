"""The ops' contract limits: the same on every device, so that no call works on the CPU and fails
on the GPU. The checks and the kernels read them here."""

MOE_MAX_EXPERTS = 1024
MOE_MAX_TOPK = 32
MOE_MAX_GROUPS = 32  # num_expert_group
TOPK_MAX_K = 4096
TOPK_MAX_WIDTH = 1 << 20
TOPK_MAX_ROWS = 65535  # the CUDA engine puts rows on a grid dimension capped there
MAX_BLOCK_SIZE = 256
MAX_NEXT_N = 1024  # decode_row_lengths: query rows per request
